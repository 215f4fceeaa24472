// llama.cpp's decode speed on a GGUF file (npm node-llama-cpp, its prebuilt CPU binary), for
// bench/bench_gguf.sh: prefill PROMPT tokens, then time DECODE greedy tokens one by one.
// Usage: node bench/llama_cpp_decode.mjs MODEL.gguf PROMPT DECODE THREADS
import path from "node:path";
import { fileURLToPath, pathToFileURL } from "node:url";

const here = path.dirname(fileURLToPath(import.meta.url));
const npm = path.resolve(here, "../tools/npm/node_modules");
const { getLlama } = await import(pathToFileURL(path.join(npm, "node-llama-cpp/dist/index.js")));

const [modelPath, nPrompt, nDecode, threads] = process.argv.slice(2);
const llama = await getLlama({ gpu: false, build: "never", logLevel: "error" });
const model = await llama.loadModel({ modelPath, gpuLayers: 0 });
const context = await model.createContext({ contextSize: Math.max(512, Number(nPrompt) + Number(nDecode) + 8),
  batchSize: 512, threads: Number(threads) });
const seq = context.getSequence();
// The same ids as bench_decoder: <bos>, then 1000 + (i·7919) mod 200000.
const ids = Array.from({ length: Number(nPrompt) }, (_, i) => (i === 0 ? 2 : 1000 + ((i * 7919) % 200000)));
let t0 = performance.now(), first = 0, n = 0;
for await (const tok of seq.evaluate(ids, { temperature: 0 })) {
  if (n === 0) first = performance.now();  // prefill done, first token out
  if (++n > Number(nDecode)) break;
}
const decode = (performance.now() - first) / 1000;
console.log(`llama.cpp decode: ${Number(nDecode)} tokens in ${decode.toFixed(2)} s = ` +
  `${(Number(nDecode) / decode).toFixed(3)} tokens/s (prefill + first token ${((first - t0) / 1000).toFixed(2)} s)`);
process.exit(0);
