// Byte-level BPE training (see bpe_trainer.h). The classic algorithm over distinct
// pre-tokenized words weighted by count: pair counts are kept in a map plus an ordered set
// (count desc, then ids), and an index pair -> words, so each merge only revisits the words
// that contain its pair.
#include "text/bpe_trainer.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <map>
#include <set>
#include <tuple>
#include <unordered_map>

#include "common/error.h"
#include "common/json_io.h"
#include "text/byte_level.h"
#include "text/tokenizer.h"

namespace dsv4 {
namespace {

// DeepSeek-V3's pre-tokenizer (also V3.2's and V4's): digits in runs of up to three, runs of
// CJK ideographs / kana, then the word/punctuation/whitespace regex, then byte-level mapping.
OrderedJson deepseek_pre_tokenizer() {
  auto split = [](const char* regex) {
    return OrderedJson{{"type", "Split"},
                       {"pattern", {{"Regex", regex}}},
                       {"behavior", "Isolated"},
                       {"invert", false}};
  };
  return OrderedJson{
      {"type", "Sequence"},
      {"pretokenizers",
       {split(R"(\p{N}{1,3})"), split("[\u4e00-\u9fa5\u3040-\u309f\u30a0-\u30ff]+"),
        split("[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+| "
              "?[\\p{P}\\p{S}]+[\r\n]*|\\s*[\r\n]+|\\s+(?!\\S)|\\s+"),
        {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", true}, {"use_regex", false}}}}};
}

OrderedJson added_token_json(std::int32_t id, const AddedTokenSpec& token) {
  return OrderedJson{{"id", id},          {"content", token.content}, {"single_word", false},
                     {"lstrip", false},   {"rstrip", false},          {"normalized", !token.special},
                     {"special", token.special}};
}

std::uint64_t pair_key(std::int32_t a, std::int32_t b) {
  return (static_cast<std::uint64_t>(static_cast<std::uint32_t>(a)) << 32) | static_cast<std::uint32_t>(b);
}

class PairCounts {
 public:
  void add(std::int32_t a, std::int32_t b, std::int64_t delta, std::int32_t word) {
    const std::uint64_t key = pair_key(a, b);
    std::int64_t& count = counts_[key];
    if (count > 0) ranked_.erase({-count, a, b});
    count += delta;
    if (count > 0) ranked_.insert({-count, a, b});
    if (delta > 0) words_[key].push_back(word);
  }

  bool empty() const { return ranked_.empty(); }
  std::pair<std::int32_t, std::int32_t> best() const {
    const auto& [count, a, b] = *ranked_.begin();
    return {a, b};
  }
  std::vector<std::int32_t> take_words(std::int32_t a, std::int32_t b) {
    auto it = words_.find(pair_key(a, b));
    if (it == words_.end()) return {};
    std::vector<std::int32_t> words = std::move(it->second);
    words_.erase(it);
    return words;
  }

 private:
  std::unordered_map<std::uint64_t, std::int64_t> counts_;
  std::set<std::tuple<std::int64_t, std::int32_t, std::int32_t>> ranked_;
  std::unordered_map<std::uint64_t, std::vector<std::int32_t>> words_;
};

// A small multilingual sample, written for this project, so the tiny tokenizer has merges
// for more than English: CJK, Arabic, Devanagari, Cyrillic, Greek, accents, emoji, code and
// the plain-text parts of the V4 chat markup.
constexpr std::string_view kSample = R"SAMPLE(
A tokenizer turns text into numbers and numbers back into text. The tiny model of this
project uses one trained on a license text and on this short sample, in many languages.

今天的天气很好，我们一起去公园散步吧。机器学习模型需要大量的数据来训练。这个分词器把文本切成小块。
中文、日本語、한국어都是亚洲的语言。北京是中国的首都，上海是一个很大的城市。
今日はいい天気ですね。東京の桜はとてもきれいです。ひらがなとカタカナと漢字を使います。
コンピューターはプログラムを実行します。ありがとうございます。
안녕하세요. 오늘은 날씨가 좋습니다. 한국어는 한글로 씁니다.
مرحبا بالعالم. اللغة العربية تكتب من اليمين إلى اليسار. شكرا جزيلا.
नमस्ते दुनिया। हिन्दी देवनागरी लिपि में लिखी जाती है। धन्यवाद।
Привет, мир! Русский язык использует кириллицу. Спасибо большое.
Γεια σου κόσμε! Η ελληνική γλώσσα έχει μακρά ιστορία.
Le café est très chaud. Où est la bibliothèque ? Ça va très bien, merci.
Die Größe der Straße ist schön. Über den Fluss führt eine Brücke.
El niño comió una manzana. ¿Dónde está la estación? ¡Qué día más bonito!
Emoji: 😀 😂 👍 🎉 ❤️ 👩‍💻 👨‍👩‍👧‍👦 🏳️‍🌈 🇩🇪 🇯🇵 ✨ 🚀
Numbers: 0 1 2 3 4 5 6 7 8 9 10 42 100 2024-06-01 3.14159 1,000,000 12:30 99.9% $19.99

int main(int argc, char** argv) {
  for (int i = 0; i < argc; ++i) std::printf("%s\n", argv[i]);
  return 0;
}

def greet(name: str) -> str:
    return f"Hello, {name}!"

{"name": "get_weather", "description": "Get the weather of a city", "parameters": {"type": "object",
 "properties": {"city": {"type": "string"}, "days": {"type": "integer"}}, "required": ["city"]}}

## Tools

You have access to a set of tools. invoke name="get_weather" parameter name="city" string="true"
<tool_result>{"temperature": 21, "unit": "celsius"}</tool_result>
)SAMPLE";

}  // namespace

BpeTrainOptions v4_tokenizer_options(std::int32_t vocab_size) {
  BpeTrainOptions o;
  o.vocab_size = vocab_size;
  o.head_tokens = {{"<｜begin▁of▁sentence｜>", true}, {"<｜end▁of▁sentence｜>", true}, {"<｜▁pad▁｜>", true}};
  o.tail_tokens = {{"<｜User｜>", true},      {"<｜Assistant｜>", true}, {"<｜latest_reminder｜>", true},
                   {"<｜action｜>", true},    {"<｜query｜>", true},     {"<｜authority｜>", true},
                   {"<｜domain｜>", true},    {"<｜title｜>", true},     {"<｜read_url｜>", true},
                   {"<think>", false},        {"</think>", false},       {"｜DSML｜", false}};
  return o;
}

std::string train_bpe_tokenizer(std::string_view corpus, const BpeTrainOptions& options) {
  const auto head = static_cast<std::int32_t>(options.head_tokens.size());
  const auto tail = static_cast<std::int32_t>(options.tail_tokens.size());
  const std::int32_t merge_end = options.vocab_size - tail;  // first tail id
  if (merge_end < head + 256)
    fail("BPE training: vocab_size {} leaves no room for {} added tokens and 256 byte symbols",
         options.vocab_size, head + tail);

  // Token strings (raw bytes) by id; bytes first.
  std::vector<std::string> token_bytes;
  std::map<std::string, std::int32_t> id_of;  // bytes -> id (merged tokens)
  for (std::int32_t b = 0; b < 256; ++b) {
    token_bytes.emplace_back(1, static_cast<char>(b));
    id_of.emplace(token_bytes.back(), head + b);
  }
  auto bytes_of = [&](std::int32_t id) -> const std::string& {
    return token_bytes[static_cast<std::size_t>(id - head)];
  };

  // A tokenizer with no merges does the pre-tokenization, so training sees exactly the pieces
  // encoding will see.
  OrderedJson skeleton_vocab = OrderedJson::object();
  for (std::int32_t b = 0; b < 256; ++b)
    skeleton_vocab[byte_level::encode(token_bytes[static_cast<std::size_t>(b)])] = head + b;
  const OrderedJson skeleton{{"normalizer", nullptr},
                             {"pre_tokenizer", deepseek_pre_tokenizer()},
                             {"decoder", {{"type", "ByteLevel"}}},
                             {"model", {{"type", "BPE"}, {"vocab", skeleton_vocab}, {"merges", OrderedJson::array()}}}};
  const Tokenizer splitter = Tokenizer::from_json_text(skeleton.dump(), "BPE trainer skeleton");

  std::map<std::string, std::int64_t> word_counts;
  for (auto& piece : splitter.pre_tokenize(corpus)) ++word_counts[piece];
  std::vector<std::vector<std::int32_t>> words;
  std::vector<std::int64_t> counts;
  for (const auto& [word, count] : word_counts) {
    std::vector<std::int32_t> symbols;
    for (char c : word) symbols.push_back(head + static_cast<unsigned char>(c));
    words.push_back(std::move(symbols));
    counts.push_back(count);
  }

  PairCounts pairs;
  auto add_word_pairs = [&](std::int32_t w, std::int64_t sign) {
    const auto& symbols = words[static_cast<std::size_t>(w)];
    for (std::size_t i = 0; i + 1 < symbols.size(); ++i)
      pairs.add(symbols[i], symbols[i + 1], sign * counts[static_cast<std::size_t>(w)], w);
  };
  for (std::int32_t w = 0; w < static_cast<std::int32_t>(words.size()); ++w) add_word_pairs(w, +1);

  std::vector<std::pair<std::int32_t, std::int32_t>> merges;
  std::int32_t next_id = head + 256;
  while (next_id < merge_end) {
    if (pairs.empty())
      fail("BPE training: the corpus ran out of pairs after {} merges ({} new tokens wanted)", merges.size(),
           merge_end - head - 256);
    const auto [a, b] = pairs.best();
    std::string merged = bytes_of(a) + bytes_of(b);
    std::int32_t id;
    if (auto it = id_of.find(merged); it != id_of.end()) {
      id = it->second;  // reached before by another pair: a merge, but no new token
    } else {
      id = next_id++;
      id_of.emplace(merged, id);
      token_bytes.push_back(std::move(merged));
    }
    merges.emplace_back(a, b);

    std::vector<std::int32_t> affected = pairs.take_words(a, b);
    std::sort(affected.begin(), affected.end());
    affected.erase(std::unique(affected.begin(), affected.end()), affected.end());
    for (std::int32_t w : affected) {
      auto& symbols = words[static_cast<std::size_t>(w)];
      bool has = false;
      for (std::size_t i = 0; i + 1 < symbols.size() && !has; ++i) has = symbols[i] == a && symbols[i + 1] == b;
      if (!has) continue;
      add_word_pairs(w, -1);
      std::vector<std::int32_t> rewritten;
      for (std::size_t i = 0; i < symbols.size(); ++i) {
        if (i + 1 < symbols.size() && symbols[i] == a && symbols[i + 1] == b) {
          rewritten.push_back(id);
          ++i;
        } else {
          rewritten.push_back(symbols[i]);
        }
      }
      symbols = std::move(rewritten);
      add_word_pairs(w, +1);
    }
  }

  // tokenizer.json.
  OrderedJson added = OrderedJson::array();
  OrderedJson vocab = OrderedJson::object();
  for (std::int32_t i = 0; i < head; ++i) {
    added.push_back(added_token_json(i, options.head_tokens[static_cast<std::size_t>(i)]));
    vocab[options.head_tokens[static_cast<std::size_t>(i)].content] = i;
  }
  for (std::int32_t id = head; id < merge_end; ++id) vocab[byte_level::encode(bytes_of(id))] = id;
  for (std::int32_t i = 0; i < tail; ++i) {
    added.push_back(added_token_json(merge_end + i, options.tail_tokens[static_cast<std::size_t>(i)]));
    vocab[options.tail_tokens[static_cast<std::size_t>(i)].content] = merge_end + i;
  }
  OrderedJson merge_list = OrderedJson::array();
  for (const auto& [a, b] : merges)
    merge_list.push_back(byte_level::encode(bytes_of(a)) + " " + byte_level::encode(bytes_of(b)));

  const OrderedJson out{{"version", "1.0"},
                        {"truncation", nullptr},
                        {"padding", nullptr},
                        {"added_tokens", added},
                        {"normalizer", {{"type", "Sequence"}, {"normalizers", OrderedJson::array()}}},
                        {"pre_tokenizer", deepseek_pre_tokenizer()},
                        {"post_processor", nullptr},
                        {"decoder", {{"type", "ByteLevel"}, {"add_prefix_space", true}, {"trim_offsets", true},
                                     {"use_regex", true}}},
                        {"model",
                         {{"type", "BPE"},
                          {"dropout", nullptr},
                          {"unk_token", nullptr},
                          {"continuing_subword_prefix", nullptr},
                          {"end_of_word_suffix", nullptr},
                          {"fuse_unk", false},
                          {"byte_fallback", false},
                          {"ignore_merges", false},
                          {"vocab", vocab},
                          {"merges", merge_list}}}};
  return out.dump(1) + "\n";
}

std::string tiny_tokenizer_corpus() {
  std::string corpus;
  for (const char* path : {"/usr/share/common-licenses/GPL-3", "/usr/share/common-licenses/GPL-2"})
    corpus += read_text_file(path);
  corpus += kSample;
  return corpus;
}

std::string tokenizer_config_json(const BpeTrainOptions& options) {
  auto name = [&](std::size_t i) -> OrderedJson {
    return i < options.head_tokens.size() ? OrderedJson(options.head_tokens[i].content) : OrderedJson(nullptr);
  };
  const OrderedJson config{{"add_bos_token", false},
                           {"add_eos_token", false},
                           {"bos_token", name(0)},
                           {"eos_token", name(1)},
                           {"pad_token", name(2)},
                           {"unk_token", nullptr},
                           {"clean_up_tokenization_spaces", false},
                           {"legacy", true},
                           {"model_max_length", 1048576},
                           {"tokenizer_class", "PreTrainedTokenizerFast"}};
  return config.dump(2) + "\n";
}

void write_tiny_tokenizer(const std::filesystem::path& dir) {
  const BpeTrainOptions options = v4_tokenizer_options(4096);
  const std::string json = train_bpe_tokenizer(tiny_tokenizer_corpus(), options);
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) fail("cannot create {}: {}", dir.string(), ec.message());
  write_text_file(dir / "tokenizer.json", json);
  write_text_file(dir / "tokenizer_config.json", tokenizer_config_json(options));
}

}  // namespace dsv4
