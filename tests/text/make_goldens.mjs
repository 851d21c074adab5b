// Writes tiny_tokenizer_goldens.json: encodings of test strings by an independent
// implementation of the tokenizer.json format, Hugging Face's pure-JavaScript tokenizers.js
// (npm @huggingface/tokenizers 0.2.0), for the built-in model's tokenizer.
//
//   npm install --prefix /tmp/tok-golden @huggingface/tokenizers@0.2.0
//   DSV4_WRITE_TINY_TOKENIZER=/tmp/tiny build/tests/text/test_text \
//       --gtest_filter=TinyTokenizer.WritesFiles       (writes the trained tokenizer to /tmp/tiny)
//   NODE_PATH=/tmp/tok-golden/node_modules node tests/text/make_goldens.mjs /tmp/tiny \
//       > tests/text/tiny_tokenizer_goldens.json
import { createRequire } from "node:module";
import { readFileSync } from "node:fs";

const require = createRequire(process.env.NODE_PATH ? process.env.NODE_PATH + "/" : import.meta.url);
const { Tokenizer } = require("@huggingface/tokenizers");

const dir = process.argv[2];
const jsonText = readFileSync(`${dir}/tokenizer.json`, "utf8");
const tokenizer = new Tokenizer(JSON.parse(jsonText), JSON.parse(readFileSync(`${dir}/tokenizer_config.json`, "utf8")));

const texts = [
  "",
  "Hello, world!",
  "It's a test; don't panic. You'll see we've done it.",
  "The GNU General Public License is a free, copyleft license for software.",
  "今天的天气很好，我们一起去公园散步吧。",
  "東京の桜はとてもきれいです。カタカナとひらがなと漢字",
  "안녕하세요, 세계! 한국어는 한글로 씁니다.",
  "مرحبا بالعالم. اللغة العربية",
  "नमस्ते दुनिया। हिन्दी देवनागरी",
  "Привет, мир! Γεια σου κόσμε!",
  "naïve café résumé Straße Ångström",
  "e\u0301 n\u0303 a\u030a Z\u0351\u0352\u0353 combining",
  "👩‍💻 👨‍👩‍👧‍👦 🏳️‍🌈 🇩🇪🇯🇵 ❤️ 😀😂👍",
  "𝔘𝔫𝔦𝔠𝔬𝔡𝔢 𐍈 math 𝑥²",
  "a" + " ".repeat(40) + "b\n\n\n\t\t  c   \n   ",
  " ".repeat(300) + "x" + "\t".repeat(17) + "\n".repeat(9) + " \u3000\u00a0 end",
  "1234567890 3.14159 1,000,000 12:30 ١٢٣٤٥ ４５６ ⅷ ½",
  "9".repeat(100),
  "line one\r\nline two\r\n\r\nthree\rfour",
  "int main(int argc, char** argv) {\n\treturn printf(\"%d\\n\", argc);\n}",
  "!!!???... --- ((())) \"quoted\" 'single' `back` @user #tag $5 100%",
  "<｜begin▁of▁sentence｜>You are helpful.<｜User｜>What is 2+2?<｜Assistant｜></think>4<｜end▁of▁sentence｜>",
  "<｜User｜>think<｜Assistant｜><think>Let me see.</think>Sure.",
  "\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"get_weather\">\n<｜DSML｜parameter name=\"city\" string=\"true\">北京</｜DSML｜parameter>\n</｜DSML｜invoke>\n</｜DSML｜tool_calls>",
  "<｜User partial <｜end▁of▁sentence <think",
  "<tool_result>{\"temperature\": 21}</tool_result>",
];

// FNV-1a (64-bit) of the tokenizer.json bytes, which the test recomputes to tell a changed
// tokenizer (e.g. different license texts) from an encoder bug.
function fnv1a64(bytes) {
  let h = 0xcbf29ce484222325n;
  for (const b of bytes) h = ((h ^ BigInt(b)) * 0x100000001b3n) & 0xffffffffffffffffn;
  return h.toString(16).padStart(16, "0");
}

const cases = texts.map((text) => ({ text, ids: tokenizer.encode(text, { add_special_tokens: false }).ids }));
const out = {
  note: "Made by tests/text/make_goldens.mjs with npm @huggingface/tokenizers 0.2.0 (tokenizers.js), " +
    "an independent JavaScript implementation, on the tokenizer write_tiny_tokenizer trains.",
  tokenizer_json_fnv1a64: fnv1a64(readFileSync(`${dir}/tokenizer.json`)),
  cases,
};
// One case per line, so diffs stay readable.
const lines = cases.map((c) => "  " + JSON.stringify(c));
process.stdout.write("{\n" +
  ` "note": ${JSON.stringify(out.note)},\n` +
  ` "tokenizer_json_fnv1a64": ${JSON.stringify(out.tokenizer_json_fnv1a64)},\n` +
  ` "cases": [\n${lines.join(",\n")}\n ]\n}\n`);
