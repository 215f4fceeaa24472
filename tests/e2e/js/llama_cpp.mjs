// llama.cpp (through the npm package node-llama-cpp, its prebuilt CPU binary) on a GGUF file:
// loads it, tokenizes texts with its own tokenizer, and greedily continues prompts.
// Usage: node llama_cpp.mjs MODEL.gguf < input.json
//   input  {"tokenize": [text, ...], "generate": [{"ids": [...], "n": N}, ...]}
//   output {"n_vocab", "tokenize": [[ids], ...], "generate": [[ids], ...]}
// Tokenization: no BOS added, special-token text left literal (llama.cpp's parse_special false).
import fs from "node:fs";
import path from "node:path";
import { fileURLToPath, pathToFileURL } from "node:url";

const here = path.dirname(fileURLToPath(import.meta.url));
const npm = path.resolve(here, "../../../tools/npm/node_modules");
const { getLlama } = await import(pathToFileURL(path.join(npm, "node-llama-cpp/dist/index.js")));

const [modelPath] = process.argv.slice(2);
const input = JSON.parse(fs.readFileSync(0, "utf8"));
const llama = await getLlama({ gpu: false, build: "never", logLevel: "error" });
const model = await llama.loadModel({ modelPath, gpuLayers: 0 });
const out = { n_vocab: model.tokens.trainContextSize !== undefined ? undefined : undefined, tokenize: [], generate: [] };
for (const t of input.tokenize ?? []) out.tokenize.push(Array.from(model.tokenize(t, false)));
if ((input.generate ?? []).length) {
  const context = await model.createContext({ contextSize: 512, batchSize: 512, threads: 2 });
  for (const g of input.generate) {
    const seq = context.getSequence();
    const got = [];
    for await (const tok of seq.evaluate(g.ids, { temperature: 0 })) {
      got.push(tok);
      if (got.length >= g.n) break;
    }
    out.generate.push(got);
    seq.dispose();
  }
}
console.log(JSON.stringify(out));
process.exit(0);
