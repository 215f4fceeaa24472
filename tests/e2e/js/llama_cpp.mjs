// llama.cpp (through the npm package node-llama-cpp, its prebuilt CPU binary) on a GGUF file:
// loads it, tokenizes texts with its own tokenizer, and greedily continues prompts.
// Usage: node llama_cpp.mjs MODEL.gguf IN.json OUT.json (files, not pipes: large payloads)
//   input  {"tokenize": [text, ...], "generate": [{"ids": [...], "n": N}, ...], "logits": [[ids], ...]}
//   output {"tokenize": [[ids], ...], "generate": [[ids], ...], "logits": [[[logit per vocab id] per position], ...]}
// "logits": the raw next-token logits at every prompt position (llama.cpp's output, unsampled).
// Tokenization: no BOS added, special-token text left literal (llama.cpp's parse_special false).
import fs from "node:fs";
import path from "node:path";
import { fileURLToPath, pathToFileURL } from "node:url";

const here = path.dirname(fileURLToPath(import.meta.url));
const npm = path.resolve(here, "../../../tools/npm/node_modules");
const { getLlama } = await import(pathToFileURL(path.join(npm, "node-llama-cpp/dist/index.js")));

const [modelPath, inPath, outPath] = process.argv.slice(2);
const input = JSON.parse(fs.readFileSync(inPath, "utf8"));
const llama = await getLlama({ gpu: false, build: "never", logLevel: "error" });
const model = await llama.loadModel({ modelPath, gpuLayers: 0 });
const out = { tokenize: [], generate: [], logits: [] };
for (const t of input.tokenize ?? []) out.tokenize.push(Array.from(model.tokenize(t, false)));
if ((input.generate ?? []).length || (input.logits ?? []).length) {
  // f32 KV cache and no flash attention: llama.cpp's defaults (f16 cache) would round K and V.
  const context = await model.createContext({ contextSize: 512, batchSize: 512, threads: 2, flashAttention: false,
    experimentalKvCacheKeyType: "F32", experimentalKvCacheValueType: "F32" });
  for (const g of input.generate ?? []) {
    const seq = context.getSequence();
    const got = [];
    for await (const tok of seq.evaluate(g.ids, { temperature: 0 })) {
      got.push(tok);
      if (got.length >= g.n) break;
    }
    out.generate.push(got);
    seq.dispose();
  }
  for (const ids of input.logits ?? []) {
    const seq = context.getSequence();
    const res = await seq.controlledEvaluate(ids.map((t) => [t, { generateNext: { logits: true } }]));
    out.logits.push(res.map((r) => {
      const row = new Array(r.next.logits.size);
      for (const [tok, v] of r.next.logits) row[tok] = v;
      return row;
    }));
    seq.dispose();
  }
}
fs.writeFileSync(outPath, JSON.stringify(out));
process.exit(0);
