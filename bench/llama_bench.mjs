// llama.cpp's text speed on a GGUF file, through the npm package node-llama-cpp (its prebuilt
// CPU binary), measured the way `vlm bench` measures ours: prefill of a PP-token prompt in one
// batch (pp tok/s), then TG greedy tokens after a one-token prompt in a fresh sequence (tg
// tok/s, the prompt step not counted). Prints one JSON object.
// Usage: node bench/llama_bench.mjs MODEL.gguf [THREADS=2] [PP=512] [TG=128]
import path from "node:path";
import { fileURLToPath, pathToFileURL } from "node:url";

const here = path.dirname(fileURLToPath(import.meta.url));
const npm = path.resolve(here, "../tools/npm/node_modules");
const { getLlama } = await import(pathToFileURL(path.join(npm, "node-llama-cpp/dist/index.js")));

const [modelPath, threadsArg = "2", ppArg = "512", tgArg = "128"] = process.argv.slice(2);
const threads = Number(threadsArg), pp = Number(ppArg), tg = Number(tgArg);
if (!modelPath || !(threads > 0 && pp > 0 && tg > 0)) {
  console.error("usage: node bench/llama_bench.mjs MODEL.gguf [THREADS] [PP] [TG]");
  process.exit(2);
}
const llama = await getLlama({ gpu: false, build: "never", logLevel: "error" });
const model = await llama.loadModel({ modelPath, gpuLayers: 0 });
// llama-bench's defaults: flash attention off, f16 KV cache; the whole prompt in one batch.
const context = await model.createContext({ contextSize: Math.max(pp, tg) + 16, batchSize: pp, threads,
  flashAttention: false });
const prompt = [2];
for (let i = 1; i < pp; ++i) prompt.push(1000 + ((i * 7919 + 104729) % 200000));

// Warm-up: one token pages the weights in.
let seq = context.getSequence();
await seq.evaluateWithoutGeneratingNewTokens([2]);
seq.dispose();

seq = context.getSequence();
let t0 = performance.now();
await seq.evaluateWithoutGeneratingNewTokens(prompt);
const ppS = (performance.now() - t0) / 1000;
seq.dispose();

seq = context.getSequence();
let first = 0, n = 0;
for await (const tok of seq.evaluate([2], { temperature: 0 })) {
  void tok;
  if (n === 0) first = performance.now();
  if (++n > tg) break;
}
const tgS = (performance.now() - first) / 1000;
seq.dispose();
console.log(JSON.stringify({ model: modelPath, threads, pp, tg, pp_tok_s: pp / ppS, tg_tok_s: tg / tgS,
  pp_s: ppS, tg_s: tgS }));
process.exit(0);
