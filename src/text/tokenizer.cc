// Byte-level BPE from a Hugging Face tokenizer.json, the kind DeepSeek V3/V3.2/V4 ship.
//
// Encoding, as in HF tokenizers with add_special_tokens=False:
//   1. added tokens are cut out of the text first, leftmost-longest, in HF's two passes (tokens
//      with normalized=false, then those with normalized=true); special ones only when allowed;
//   2. the rest is split into valid-UTF-8 runs and single invalid bytes; each run goes through
//      the pre-tokenizer's splits in order, each split working inside the previous pieces;
//   3. each piece's bytes become byte-level symbols (GPT-2's bytes_to_unicode) and the merges
//      are applied lowest rank first (leftmost on ties), like HF's BPE::merge_all.
// Decoding concatenates the tokens' bytes: a vocab token's characters mapped back through the
// byte table (raw spelling if a character is not in the table, as HF's ByteLevel decoder does),
// an added token's content as is. Invalid UTF-8 stays raw (HF would write U+FFFD).
//
// Supported tokenizer.json features (anything else is an Error that names it):
//   normalizer: null, or a Sequence with no normalizers;
//   pre_tokenizer: ByteLevel (add_prefix_space false; use_regex true adds GPT-2's split), or a
//     Sequence of Split (pattern Regex or String; behavior Removed, Isolated,
//     MergedWithPrevious, MergedWithNext, Contiguous; invert) and Digits, ending in ByteLevel;
//   model: BPE with vocab and merges ("a b" strings or [a, b] pairs), ignore_merges; dropout,
//     continuing_subword_prefix and end_of_word_suffix must be unset; unk_token and
//     byte_fallback are accepted but never used (every byte has a symbol in the vocab);
//   decoder: ByteLevel; post_processor: not applied (encode never adds BOS); truncation and
//     padding must be null;
//   added_tokens: lstrip, rstrip and single_word must be false.
// Regex patterns are compiled by PCRE2 (UTF + UCP) as written: HF uses Oniguruma, which agrees
// on everything DeepSeek's patterns use (\p{..} classes, ranges, lookahead); Oniguruma-only
// syntax is not translated.
#include "text/tokenizer.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <queue>
#include <unordered_map>
#include <utility>

#include "common/error.h"
#include "common/json_io.h"
#include "common/json_reader.h"
#include "text/byte_level.h"
#include "text/utf8.h"

namespace dsv4 {
namespace {

constexpr std::int32_t kMaxTokenId = (1 << 21) - 1;  // real vocabularies stay under 300k

// A vocab token's bytes: each character through the byte-level alphabet, or the raw spelling
// if some character is not in it (HF's ByteLevel decoder).
std::string byte_level_decode(std::string_view spelling) {
  return byte_level::decode(spelling).value_or(std::string(spelling));
}

// ---- Split regexes -----------------------------------------------------------------------------

struct PcreCodeFree {
  void operator()(pcre2_code* code) const { pcre2_code_free(code); }
};
struct PcreMatchDataFree {
  void operator()(pcre2_match_data* data) const { pcre2_match_data_free(data); }
};

std::string pcre_error_text(int code) {
  std::array<PCRE2_UCHAR, 256> buffer{};
  pcre2_get_error_message(code, buffer.data(), buffer.size());
  return std::string(reinterpret_cast<const char*>(buffer.data()));
}

enum class SplitBehavior { kRemoved, kIsolated, kMergedWithPrevious, kMergedWithNext, kContiguous };

struct SplitStep {
  std::string pattern;  // for error messages
  std::unique_ptr<pcre2_code, PcreCodeFree> code;
  SplitBehavior behavior = SplitBehavior::kIsolated;
  bool invert = false;
};

SplitStep make_split(const std::string& pattern, bool literal, SplitBehavior behavior, bool invert,
                     const std::string& where) {
  int error = 0;
  PCRE2_SIZE offset = 0;
  const std::uint32_t options = PCRE2_UTF | (literal ? PCRE2_LITERAL : PCRE2_UCP);  // LITERAL refuses UCP
  pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(), options,
                                   &error, &offset, nullptr);
  if (code == nullptr)
    fail("{}: bad regex {:?} at offset {}: {}", where, pattern, offset, pcre_error_text(error));
  pcre2_jit_compile(code, PCRE2_JIT_COMPLETE);  // optional speed-up; falls back to the interpreter
  SplitStep step;
  step.pattern = pattern;
  step.code.reset(code);
  step.behavior = behavior;
  step.invert = invert;
  return step;
}

// Appends the pieces `step` cuts `text` (valid UTF-8) into, with HF's Split semantics.
void apply_split(const SplitStep& step, std::string_view text, std::vector<std::string_view>& out) {
  if (text.empty()) return;
  struct Segment {
    std::size_t begin, end;
    bool match;
  };
  std::vector<Segment> segments;
  std::unique_ptr<pcre2_match_data, PcreMatchDataFree> data(
      pcre2_match_data_create_from_pattern(step.code.get(), nullptr));
  if (!data) fail("out of memory for regex match data");
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  std::size_t previous = 0, position = 0;
  while (position <= text.size()) {
    const int rc = pcre2_match(step.code.get(), subject, text.size(), position, PCRE2_NO_UTF_CHECK,
                               data.get(), nullptr);
    if (rc == PCRE2_ERROR_NOMATCH) break;
    if (rc < 0) fail("pre-tokenizer regex {:?} failed: {}", step.pattern, pcre_error_text(rc));
    const PCRE2_SIZE* ovector = pcre2_get_ovector_pointer(data.get());
    std::size_t begin = ovector[0], end = ovector[1];
    if (begin > end || begin < previous) fail("pre-tokenizer regex {:?}: \\K is not supported", step.pattern);
    if (previous != begin) segments.push_back({previous, begin, false});
    segments.push_back({begin, end, true});
    previous = end;
    if (end == begin) {  // empty match: step over one character
      if (begin >= text.size()) break;
      position = begin + std::max<std::size_t>(1, utf8::char_length(text, begin));
    } else {
      position = end;
    }
  }
  if (previous != text.size()) segments.push_back({previous, text.size(), false});
  if (step.invert)
    for (auto& s : segments) s.match = !s.match;

  std::vector<std::pair<std::size_t, std::size_t>> pieces;
  switch (step.behavior) {
    case SplitBehavior::kRemoved:
      for (const auto& s : segments)
        if (!s.match) pieces.emplace_back(s.begin, s.end);
      break;
    case SplitBehavior::kIsolated:
      for (const auto& s : segments) pieces.emplace_back(s.begin, s.end);
      break;
    case SplitBehavior::kMergedWithPrevious: {
      bool previous_match = false;
      for (const auto& s : segments) {
        if (s.match && !previous_match && !pieces.empty())
          pieces.back().second = s.end;
        else
          pieces.emplace_back(s.begin, s.end);
        previous_match = s.match;
      }
      break;
    }
    case SplitBehavior::kMergedWithNext: {
      bool previous_match = false;
      for (auto it = segments.rbegin(); it != segments.rend(); ++it) {
        if (it->match && !previous_match && !pieces.empty())
          pieces.back().first = it->begin;
        else
          pieces.emplace_back(it->begin, it->end);
        previous_match = it->match;
      }
      std::reverse(pieces.begin(), pieces.end());
      break;
    }
    case SplitBehavior::kContiguous: {
      bool previous_match = false;
      for (const auto& s : segments) {
        if (s.match == previous_match && !pieces.empty())
          pieces.back().second = s.end;
        else
          pieces.emplace_back(s.begin, s.end);
        previous_match = s.match;
      }
      break;
    }
  }
  for (const auto& [begin, end] : pieces)
    if (end > begin) out.push_back(text.substr(begin, end - begin));
}

// ---- Added tokens ----------------------------------------------------------------------------

// A byte trie over added tokens' contents, for leftmost-longest matching.
class AddedTokenTrie {
 public:
  AddedTokenTrie() : nodes_(1) {}

  void insert(std::string_view content, std::int32_t id, bool special) {
    std::size_t node = 0;
    for (char c : content) {
      const auto byte = static_cast<unsigned char>(c);
      std::int32_t child = find_child(node, byte);
      if (child < 0) {
        child = static_cast<std::int32_t>(nodes_.size());
        nodes_[node].children.emplace_back(byte, child);
        nodes_.emplace_back();
      }
      node = static_cast<std::size_t>(child);
    }
    nodes_[node].id = id;
    nodes_[node].special = special;
  }

  bool empty() const { return nodes_.size() == 1; }

  // Longest token starting at text[at] (skipping special ones unless allowed): {id, length},
  // or {-1, 0}.
  std::pair<std::int32_t, std::size_t> longest_at(std::string_view text, std::size_t at,
                                                  bool allow_special) const {
    std::pair<std::int32_t, std::size_t> best{-1, 0};
    std::size_t node = 0;
    for (std::size_t i = at; i < text.size(); ++i) {
      const std::int32_t child = find_child(node, static_cast<unsigned char>(text[i]));
      if (child < 0) break;
      node = static_cast<std::size_t>(child);
      if (nodes_[node].id >= 0 && (allow_special || !nodes_[node].special)) best = {nodes_[node].id, i + 1 - at};
    }
    return best;
  }

 private:
  struct Node {
    std::vector<std::pair<unsigned char, std::int32_t>> children;
    std::int32_t id = -1;
    bool special = false;
  };

  std::int32_t find_child(std::size_t node, unsigned char byte) const {
    for (const auto& [b, child] : nodes_[node].children)
      if (b == byte) return child;
    return -1;
  }

  std::vector<Node> nodes_;
};

// ---- tokenizer.json fields -------------------------------------------------------------------

// tokenizer.json as Hugging Face writes it: null means unset.
constexpr JsonRules kTokenizerRules{.null_is_absent = true};

std::int32_t read_token_id(const JsonField& value) { return static_cast<std::int32_t>(value.integer(0, kMaxTokenId)); }

std::uint64_t pair_key(std::int32_t a, std::int32_t b) {
  return (static_cast<std::uint64_t>(static_cast<std::uint32_t>(a)) << 32) | static_cast<std::uint32_t>(b);
}

constexpr const char* kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

}  // namespace

// ---- Impl ---------------------------------------------------------------------------------------

struct Tokenizer::Impl {
  enum Kind : std::uint8_t { kNone = 0, kVocab = 1, kAdded = 2, kSpecial = 3 };
  struct Merge {
    std::int32_t rank;
    std::int32_t id;
  };

  std::unordered_map<std::string, std::int32_t> vocab;  // spelling -> id
  std::unordered_map<std::string, std::int32_t> added;  // content -> id
  std::vector<std::string> bytes;                       // id -> decoded bytes
  std::vector<Kind> kind;                               // id -> kind
  std::array<std::int32_t, 256> byte_id{};
  std::unordered_map<std::uint64_t, Merge> merges;
  bool ignore_merges = false;
  std::vector<SplitStep> steps;
  AddedTokenTrie added_raw;         // normalized=false: matched first
  AddedTokenTrie added_normalized;  // normalized=true

  void pre_tokenize(std::string_view text, std::vector<std::string_view>& out) const;
  void bpe(std::string_view piece, std::vector<std::int32_t>& out) const;
  void encode_plain(std::string_view text, std::vector<std::int32_t>& out) const;
};

void Tokenizer::Impl::pre_tokenize(std::string_view text, std::vector<std::string_view>& out) const {
  std::vector<std::string_view> current, next;
  auto split_run = [&](std::string_view run) {
    if (run.empty()) return;
    current.assign(1, run);
    for (const auto& step : steps) {
      next.clear();
      for (auto piece : current) apply_split(step, piece, next);
      std::swap(current, next);
    }
    out.insert(out.end(), current.begin(), current.end());
  };
  std::size_t run_start = 0, i = 0;
  while (i < text.size()) {
    const std::size_t len = utf8::char_length(text, i);
    if (len != 0) {
      i += len;
      continue;
    }
    split_run(text.substr(run_start, i - run_start));
    out.push_back(text.substr(i, 1));  // an invalid byte is a piece of its own
    run_start = ++i;
  }
  split_run(text.substr(run_start));
}

// Merges by rank: a min-heap of candidate pairs (rank, then position), stale entries skipped.
void Tokenizer::Impl::bpe(std::string_view piece, std::vector<std::int32_t>& out) const {
  if (piece.size() == 1) {
    out.push_back(byte_id[static_cast<unsigned char>(piece[0])]);
    return;
  }
  if (ignore_merges) {
    auto it = vocab.find(byte_level::encode(piece));
    if (it != vocab.end()) {
      out.push_back(it->second);
      return;
    }
  }
  struct Symbol {
    std::int32_t id;
    std::int32_t prev, next;
    bool alive;
  };
  const auto n = static_cast<std::int32_t>(piece.size());
  std::vector<Symbol> symbols(static_cast<std::size_t>(n));
  for (std::int32_t i = 0; i < n; ++i)
    symbols[static_cast<std::size_t>(i)] = {byte_id[static_cast<unsigned char>(piece[static_cast<std::size_t>(i)])],
                                            i - 1, i + 1 < n ? i + 1 : -1, true};
  struct Candidate {
    std::int32_t rank, position;
    bool operator>(const Candidate& o) const { return rank != o.rank ? rank > o.rank : position > o.position; }
  };
  std::priority_queue<Candidate, std::vector<Candidate>, std::greater<>> queue;
  auto consider = [&](std::int32_t left) {
    if (left < 0) return;
    const Symbol& a = symbols[static_cast<std::size_t>(left)];
    if (a.next < 0) return;
    auto it = merges.find(pair_key(a.id, symbols[static_cast<std::size_t>(a.next)].id));
    if (it != merges.end()) queue.push({it->second.rank, left});
  };
  for (std::int32_t i = 0; i + 1 < n; ++i) consider(i);
  while (!queue.empty()) {
    const Candidate top = queue.top();
    queue.pop();
    Symbol& a = symbols[static_cast<std::size_t>(top.position)];
    if (!a.alive || a.next < 0) continue;
    Symbol& b = symbols[static_cast<std::size_t>(a.next)];
    auto it = merges.find(pair_key(a.id, b.id));
    if (it == merges.end() || it->second.rank != top.rank) continue;  // stale
    a.id = it->second.id;
    b.alive = false;
    a.next = b.next;
    if (b.next >= 0) symbols[static_cast<std::size_t>(b.next)].prev = top.position;
    consider(a.prev);
    consider(top.position);
  }
  for (std::int32_t i = 0; i >= 0; i = symbols[static_cast<std::size_t>(i)].next)
    out.push_back(symbols[static_cast<std::size_t>(i)].id);
}

void Tokenizer::Impl::encode_plain(std::string_view text, std::vector<std::int32_t>& out) const {
  std::vector<std::string_view> pieces;
  pre_tokenize(text, pieces);
  for (auto piece : pieces) bpe(piece, out);
}

// ---- Loading ------------------------------------------------------------------------------------

Tokenizer::Tokenizer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Tokenizer::Tokenizer(Tokenizer&&) noexcept = default;
Tokenizer& Tokenizer::operator=(Tokenizer&&) noexcept = default;
Tokenizer::~Tokenizer() = default;

Tokenizer Tokenizer::from_file(const std::filesystem::path& path) {
  return from_json_text(read_text_file(path), path.string());
}

namespace {

SplitBehavior parse_behavior(const std::string& name, const std::string& where) {
  if (name == "Removed") return SplitBehavior::kRemoved;
  if (name == "Isolated") return SplitBehavior::kIsolated;
  if (name == "MergedWithPrevious") return SplitBehavior::kMergedWithPrevious;
  if (name == "MergedWithNext") return SplitBehavior::kMergedWithNext;
  if (name == "Contiguous") return SplitBehavior::kContiguous;
  fail("{}: Split behavior {:?} is not supported", where, name);
}

void parse_byte_level(const JsonObject& j, std::vector<SplitStep>& steps) {
  if (j.optional_boolean("add_prefix_space").value_or(false))
    fail("{}: ByteLevel add_prefix_space=true is not supported", j.where());
  if (j.optional_boolean("use_regex").value_or(true))
    steps.push_back(make_split(kGpt2Pattern, false, SplitBehavior::kIsolated, false, j.where()));
}

void parse_pre_tokenizer(const JsonObject& root, std::vector<SplitStep>& steps) {
  const std::optional<JsonObject> pre = root.optional_object("pre_tokenizer");
  if (!pre)
    fail("{}: pre_tokenizer is missing: only byte-level BPE (a ByteLevel pre-tokenizer) is supported", root.where());
  std::vector<JsonObject> list;
  if (pre->string("type") == "Sequence") {
    for (const JsonField& item : pre->array("pretokenizers")) list.push_back(item.object());
  } else {
    list.push_back(*pre);
  }
  bool byte_level = false;
  for (const JsonObject& p : list) {
    const std::string at = p.where();
    const std::string kind = p.string("type");
    if (byte_level) fail("{}: {} after ByteLevel is not supported (ByteLevel must come last)", at, kind);
    if (kind == "ByteLevel") {
      parse_byte_level(p, steps);
      byte_level = true;
    } else if (kind == "Split") {
      const JsonObject pattern = p.object("pattern");
      const bool invert = p.optional_boolean("invert").value_or(false);
      const auto behavior = parse_behavior(p.string("behavior"), at);
      if (const auto regex = pattern.optional_string("Regex")) {
        steps.push_back(make_split(*regex, false, behavior, invert, at));
      } else if (const auto literal = pattern.optional_string("String")) {
        steps.push_back(make_split(*literal, true, behavior, invert, at));
      } else {
        fail("{}: Split pattern must have \"Regex\" or \"String\"", at);
      }
    } else if (kind == "Digits") {
      const bool individual = p.optional_boolean("individual_digits").value_or(false);
      steps.push_back(make_split(individual ? R"(\p{N})" : R"(\p{N}+)", false, SplitBehavior::kIsolated, false, at));
    } else {
      fail("{}: pre-tokenizer type {:?} is not supported", at, kind);
    }
  }
  if (!byte_level) fail("{}: no ByteLevel step: only byte-level BPE is supported", pre->where());
}

void check_normalizer(const JsonObject& root) {
  const std::optional<JsonObject> normalizer = root.optional_object("normalizer");
  if (!normalizer) return;
  const std::string type = normalizer->string("type");
  if (type == "Sequence") {
    const auto items = normalizer->optional_array("normalizers");
    if (items && items->empty()) return;
  }
  fail("{}: normalizer {:?} is not supported (only none, or an empty Sequence)", normalizer->where(), type);
}

void check_decoder(const JsonObject& root) {
  const std::optional<JsonObject> decoder = root.optional_object("decoder");
  if (!decoder) fail("{}: decoder is missing: only a ByteLevel decoder is supported", root.where());
  const std::string type = decoder->string("type");
  if (type != "ByteLevel") fail("{}: decoder {:?} is not supported (only ByteLevel)", decoder->where(), type);
}

}  // namespace

Tokenizer Tokenizer::from_json_text(std::string_view text, const std::string& where) {
  const Json j = parse_json(text, where);
  const JsonObject root(j, where, kTokenizerRules);
  auto impl = std::make_unique<Impl>();

  check_normalizer(root);
  parse_pre_tokenizer(root, impl->steps);
  check_decoder(root);

  // Model.
  const JsonObject model = root.object("model");
  const std::string mwhere = model.where();
  if (const auto type = model.find("type"); type && type->json() != "BPE")
    fail("{}: model type {} is not supported (only BPE)", mwhere, type->json().dump());
  if (const auto dropout = model.optional_number("dropout"); dropout && *dropout != 0.0)
    fail("{}: BPE dropout is not supported", mwhere);
  for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"}) {
    if (const auto value = model.find(key); value && value->json() != "")
      fail("{}: {} is not supported", mwhere, key);
  }
  impl->ignore_merges = model.optional_boolean("ignore_merges").value_or(false);

  const JsonObject vocab = model.object("vocab");
  std::vector<std::string> spelling;  // id -> spelling, for conflict messages
  auto ensure_id = [&](std::int32_t id) {
    const auto size = static_cast<std::size_t>(id) + 1;
    if (impl->kind.size() < size) {
      impl->kind.resize(size, Impl::kNone);
      impl->bytes.resize(size);
      spelling.resize(size);
    }
  };
  for (const auto& [token, value] : vocab.json().items()) {
    const std::int32_t id =
        read_token_id(JsonField(value, where, fmt::format("model.vocab[{:?}]", token), kTokenizerRules));
    ensure_id(id);
    if (impl->kind[static_cast<std::size_t>(id)] != Impl::kNone)
      fail("{}: duplicate id {} in vocab ({:?} and {:?})", mwhere, id, spelling[static_cast<std::size_t>(id)], token);
    impl->kind[static_cast<std::size_t>(id)] = Impl::kVocab;
    impl->bytes[static_cast<std::size_t>(id)] = byte_level_decode(token);
    spelling[static_cast<std::size_t>(id)] = token;
    impl->vocab.emplace(token, id);
  }
  for (std::size_t b = 0; b < 256; ++b) {
    const std::string& symbol = byte_level::symbol(static_cast<unsigned char>(b));
    auto it = impl->vocab.find(symbol);
    if (it == impl->vocab.end())
      fail("{}: vocab lacks the byte-level symbol {:?} for byte 0x{:02X}", mwhere, symbol, b);
    impl->byte_id[b] = it->second;
  }

  const std::vector<JsonField> merges = model.array("merges");
  for (std::size_t rank = 0; rank < merges.size(); ++rank) {
    const Json& m = merges[rank].json();
    const std::string at = merges[rank].where();
    std::string left, right;
    if (m.is_string()) {
      const std::string& line = m.get_ref<const std::string&>();
      const auto space = line.find(' ');
      if (space == std::string::npos || line.find(' ', space + 1) != std::string::npos)
        fail("{}: {:?} is not two tokens separated by one space", at, line);
      left = line.substr(0, space);
      right = line.substr(space + 1);
    } else if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {
      left = m[0].get<std::string>();
      right = m[1].get<std::string>();
    } else {
      merges[rank].wrong_type("\"a b\" or [\"a\", \"b\"]");
    }
    auto a = impl->vocab.find(left), b = impl->vocab.find(right), ab = impl->vocab.find(left + right);
    if (a == impl->vocab.end()) fail("{}: {:?} is not in the vocab", at, left);
    if (b == impl->vocab.end()) fail("{}: {:?} is not in the vocab", at, right);
    if (ab == impl->vocab.end()) fail("{}: the merged token {:?} is not in the vocab", at, left + right);
    if (!impl->merges.emplace(pair_key(a->second, b->second), Impl::Merge{static_cast<std::int32_t>(rank), ab->second})
             .second)
      fail("{}: duplicate merge {:?} {:?}", at, left, right);
  }

  // Added tokens.
  if (const auto added = root.optional_array("added_tokens")) {
    for (const JsonField& item : *added) {
      const JsonObject t = item.object();
      const std::string at = t.where();
      const std::int32_t id = read_token_id(t.get("id"));
      const std::string content = t.string("content");
      if (content.empty()) fail("{}: empty content", at);
      const bool special = t.optional_boolean("special").value_or(false);
      const bool normalized = t.optional_boolean("normalized").value_or(!special);
      for (const char* key : {"lstrip", "rstrip", "single_word"})
        if (t.optional_boolean(key).value_or(false)) fail("{}: {}=true is not supported", at, key);
      ensure_id(id);
      auto& k = impl->kind[static_cast<std::size_t>(id)];
      const std::string& existing = spelling[static_cast<std::size_t>(id)];
      if (k == Impl::kAdded || k == Impl::kSpecial)
        fail("{}: duplicate added token id {} ({:?} and {:?})", at, id, existing, content);
      if (k == Impl::kVocab && existing != content)
        fail("{}: id {} is the vocab's {:?}, not {:?}", at, id, existing, content);
      if (auto v = impl->vocab.find(content); v != impl->vocab.end() && v->second != id)
        fail("{}: {:?} has id {} in the vocab, not {}", at, content, v->second, id);
      if (!impl->added.emplace(content, id).second) fail("{}: duplicate added token {:?}", at, content);
      k = special ? Impl::kSpecial : Impl::kAdded;
      impl->bytes[static_cast<std::size_t>(id)] = content;
      spelling[static_cast<std::size_t>(id)] = content;
      (normalized ? impl->added_normalized : impl->added_raw).insert(content, id, special);
    }
  }
  // "post_processor" only acts with add_special_tokens=True, which encode() does not offer.
  for (const char* key : {"truncation", "padding"})
    if (root.has(key)) fail("{}: \"{}\" is not supported (must be null)", where, key);
  return Tokenizer(std::move(impl));
}

// ---- Public API -------------------------------------------------------------------------------

std::vector<std::int32_t> Tokenizer::encode(std::string_view text, bool allow_special) const {
  // Cut out added tokens: pass 1 on the raw text, pass 2 inside what pass 1 left.
  struct Segment {
    std::string_view text;
    std::int32_t id;  // -1: plain text
  };
  std::vector<Segment> segments{{text, -1}}, next;
  for (const AddedTokenTrie* trie : {&impl_->added_raw, &impl_->added_normalized}) {
    if (trie->empty()) continue;
    next.clear();
    for (const auto& segment : segments) {
      if (segment.id >= 0) {
        next.push_back(segment);
        continue;
      }
      std::string_view s = segment.text;
      std::size_t plain_start = 0;
      for (std::size_t i = 0; i < s.size();) {
        auto [id, length] = trie->longest_at(s, i, allow_special);
        if (id < 0) {
          ++i;
          continue;
        }
        if (i > plain_start) next.push_back({s.substr(plain_start, i - plain_start), -1});
        next.push_back({s.substr(i, length), id});
        i += length;
        plain_start = i;
      }
      if (plain_start < s.size()) next.push_back({s.substr(plain_start), -1});
    }
    std::swap(segments, next);
  }
  std::vector<std::int32_t> ids;
  ids.reserve(text.size() / 3 + 4);
  for (const auto& segment : segments) {
    if (segment.id >= 0)
      ids.push_back(segment.id);
    else
      impl_->encode_plain(segment.text, ids);
  }
  return ids;
}

std::string Tokenizer::decode(std::span<const std::int32_t> ids, bool skip_special) const {
  std::string out;
  for (std::int32_t id : ids) {
    if (id < 0 || static_cast<std::size_t>(id) >= impl_->kind.size()) continue;  // unknown ids: nothing
    const auto k = impl_->kind[static_cast<std::size_t>(id)];
    if (k == Impl::kNone || (skip_special && k == Impl::kSpecial)) continue;
    out += impl_->bytes[static_cast<std::size_t>(id)];
  }
  return out;
}

std::vector<std::string> Tokenizer::pre_tokenize(std::string_view text) const {
  std::vector<std::string_view> pieces;
  impl_->pre_tokenize(text, pieces);
  return {pieces.begin(), pieces.end()};
}

std::optional<std::int32_t> Tokenizer::token_id(std::string_view token) const {
  const std::string key(token);
  if (auto it = impl_->added.find(key); it != impl_->added.end()) return it->second;
  if (auto it = impl_->vocab.find(key); it != impl_->vocab.end()) return it->second;
  return std::nullopt;
}

std::optional<std::string> Tokenizer::token_text(std::int32_t id) const {
  if (id < 0 || static_cast<std::size_t>(id) >= impl_->kind.size() ||
      impl_->kind[static_cast<std::size_t>(id)] == Impl::kNone)
    return std::nullopt;
  return impl_->bytes[static_cast<std::size_t>(id)];
}

bool Tokenizer::is_special(std::int32_t id) const {
  return id >= 0 && static_cast<std::size_t>(id) < impl_->kind.size() &&
         impl_->kind[static_cast<std::size_t>(id)] == Impl::kSpecial;
}

std::int64_t Tokenizer::vocab_size() const { return static_cast<std::int64_t>(impl_->kind.size()); }

Tokenizer::StreamDecoder::StreamDecoder(const Tokenizer& tokenizer, bool skip_special)
    : tokenizer_(&tokenizer), skip_special_(skip_special) {}

std::string Tokenizer::StreamDecoder::push(std::int32_t id) {
  const std::int32_t one[1] = {id};
  pending_ += tokenizer_->decode(one, skip_special_);
  const std::size_t keep = utf8::incomplete_tail(pending_);
  std::string ready = pending_.substr(0, pending_.size() - keep);
  pending_.erase(0, pending_.size() - keep);
  return ready;
}

std::string Tokenizer::StreamDecoder::flush() { return std::exchange(pending_, std::string()); }

}  // namespace dsv4
