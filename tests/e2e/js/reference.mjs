// Reference tokenization with the npm packages @huggingface/tokenizers and
// @huggingface/jinja (independent JS implementations of HF's tokenizer and
// Jinja). Usage: node reference.mjs MODE TOKENIZER_DIR < input.jsonl
//   encode      each line a JSON string -> {"ids": [...], "text": decode(ids)}
//   encode-literal  same, with the special added tokens removed from the
//               tokenizer first (HF's split_special_tokens=True: control-token
//               text stays literal)
//   chat        each line {"messages", "image_tokens", "crops", "layout",
//               "continue_final_message"} -> {"ids", "rendered"} or {"error"}; images
//               expanded the way HF's Gemma3Processor does (string replacement) or,
//               with layout "google", by splicing ids like the Google reference;
//               continue_final_message cut as HF's apply_chat_template cuts it
//   bench       each line a JSON string; prints {"load_s", "load_cpu_s", "encode_mb_s", "bytes"}
import fs from "node:fs";
import path from "node:path";
import { fileURLToPath, pathToFileURL } from "node:url";

const here = path.dirname(fileURLToPath(import.meta.url));
const npm = path.resolve(here, "../../../tools/npm/node_modules");
const { Tokenizer } = await import(pathToFileURL(path.join(npm, "@huggingface/tokenizers/dist/tokenizers.mjs")));
const { Template } = await import(pathToFileURL(path.join(npm, "@huggingface/jinja/dist/index.js")));

const [mode, dir] = process.argv.slice(2);
const lines = fs.readFileSync(0, "utf8").split("\n").filter((l) => l.length > 0);

const t0 = process.hrtime.bigint();
const cpu0 = process.cpuUsage();
const tokJson = JSON.parse(fs.readFileSync(path.join(dir, "tokenizer.json"), "utf8"));
const tokConfig = JSON.parse(fs.readFileSync(path.join(dir, "tokenizer_config.json"), "utf8"));
if (mode === "encode-literal") tokJson.added_tokens = tokJson.added_tokens.filter((t) => !t.special);
const tok = new Tokenizer(tokJson, tokConfig);
const loadS = Number(process.hrtime.bigint() - t0) / 1e9;
const cpu1 = process.cpuUsage(cpu0);
const loadCpuS = (cpu1.user + cpu1.system) / 1e6;

const encode = (s) => tok.encode(s, { add_special_tokens: false }).ids;
const decode = (ids) => (ids.length ? tok.decode(ids, { skip_special_tokens: false }) : "");
const out = [];

if (mode === "encode" || mode === "encode-literal") {
  for (const l of lines) {
    const ids = encode(JSON.parse(l));
    out.push(JSON.stringify({ ids, text: decode(ids) }));
  }
} else if (mode === "chat") {
  const template = new Template(tokConfig.chat_template);
  const boi = "<start_of_image>";
  for (const l of lines) {
    const { messages, image_tokens, crops, layout, continue_final_message } = JSON.parse(l);
    let rendered;
    try {
      rendered = template.render({ messages, bos_token: tokConfig.bos_token,
                                   add_generation_prompt: !continue_final_message });
      if (continue_final_message) {
        // transformers' apply_chat_template: the final message's last text block, stripped, is
        // found last in the rendering, which ends right after it (the template trims the text).
        let final = messages[messages.length - 1].content;
        if (Array.isArray(final)) final = [...final].reverse().find((b) => "text" in b).text;
        const stripped = final.trim();
        if (!rendered.includes(stripped)) throw new Error("the final message is not in the rendering");
        const at = rendered.lastIndexOf(stripped);
        const lstripped = final.trimStart();
        rendered = rendered.slice(0, at + (rendered.slice(at, at + lstripped.length) === final ? lstripped : stripped).length);
      }
    } catch (e) {
      out.push(JSON.stringify({ error: String(e.message || e) }));
      continue;
    }
    const nImages = messages.reduce(
      (n, m) => n + (Array.isArray(m.content) ? m.content.filter((p) => p.type === "image").length : 0), 0);
    const nSlots = rendered.split(boi).length - 1;
    if (nSlots !== nImages) {
      out.push(JSON.stringify({ error: `mismatch ${nSlots} slots ${nImages} images`, rendered }));
      continue;
    }
    let ids;
    if (layout === "google") {
      // Google reference (_token_utils.py): each BOI id becomes [108, BOI, soft×N, EOI, 108].
      const soft = Array(image_tokens).fill(262144);
      ids = encode(rendered).flatMap((id) => (id === 255999 ? [108, 255999, ...soft, 256000, 108] : [id]));
    } else {
      // HF Gemma3Processor: plain string replacement, then tokenize the whole string.
      const full = "\n\n" + boi + "<image_soft_token>".repeat(image_tokens) + "<end_of_image>\n\n";
      const image = crops > 0
        ? "Here is the original image " + full + " and here are some crops to help you see better " +
          Array(crops).fill(full).join(" ")
        : full;
      ids = encode(rendered.split(boi).join(image));
    }
    out.push(JSON.stringify({ ids, rendered }));
  }
} else if (mode === "bench") {
  const texts = lines.map((l) => JSON.parse(l));
  const bytes = texts.reduce((n, s) => n + Buffer.byteLength(s, "utf8"), 0);
  for (const s of texts.slice(0, 20)) encode(s);  // warm up
  const t1 = process.hrtime.bigint();
  for (const s of texts) encode(s);
  const encS = Number(process.hrtime.bigint() - t1) / 1e9;
  out.push(JSON.stringify({ load_s: loadS, load_cpu_s: loadCpuS, encode_mb_s: bytes / 1e6 / encS, bytes }));
} else {
  throw new Error(`unknown mode ${mode}`);
}
process.stdout.write(out.join("\n") + (out.length ? "\n" : ""));
