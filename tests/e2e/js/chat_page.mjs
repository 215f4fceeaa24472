// Drives the chat page (GET /) of a running `vlm serve` in headless Chromium (Debian's
// `chromium`, through npm `puppeteer-core`): a text question, an image question (file picker),
// the image answer regenerated, the image question edited, and a third answer stopped
// mid-stream; writes a screenshot.
// Usage: node chat_page.mjs BASE_URL IMAGE_PNG SCREENSHOT_PNG > result.json
import path from "node:path";
import { fileURLToPath, pathToFileURL } from "node:url";

const here = path.dirname(fileURLToPath(import.meta.url));
const npm = path.resolve(here, "../../../tools/npm/node_modules");
const { default: puppeteer } = await import(pathToFileURL(path.join(npm, "puppeteer-core/lib/esm/puppeteer/puppeteer-core.js")));

const [base, image, shot] = process.argv.slice(2);
const browser = await puppeteer.launch({
  executablePath: process.env.CHROMIUM || "/usr/bin/chromium",
  headless: true,
  args: ["--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"],
});
const result = { answers: [] };
try {
  const page = await browser.newPage();
  await page.setViewport({ width: 1000, height: 800 });
  page.on("pageerror", (e) => (result.page_error = String(e)));
  const external = [];
  page.on("request", (r) => { const u = r.url(); if (!u.startsWith(base) && !u.startsWith("data:")) external.push(u); });
  await page.goto(base + "/", { waitUntil: "load" });
  await page.waitForFunction(() => document.getElementById("model").textContent.includes("context"), { timeout: 30000 });
  result.model = await page.$eval("#model", (e) => e.textContent);

  const answer = async (n, state) => {
    await page.waitForFunction((n, state) => {
      const a = document.querySelectorAll(".msg.assistant, .msg.error");
      return a.length >= n && a[n - 1].dataset.state === state;
    }, { timeout: 60000 }, n, state);
    return page.evaluate((n) => {
      const a = document.querySelectorAll(".msg.assistant, .msg.error")[n - 1];
      return { state: a.dataset.state, text: a.textContent };
    }, n);
  };

  await page.type("#max-tokens", "24");
  await page.type("#input", "Hello, who are you?");
  await page.click("#send");
  result.answers.push(await answer(1, "done"));

  const input = await page.$("#file");
  await input.uploadFile(image);
  await page.waitForSelector("#thumbs img");
  await page.type("#input", "What is in this picture?");
  await page.click("#send");
  result.answers.push(await answer(2, "done"));
  result.user_images = await page.$$eval(".msg.user img", (imgs) => imgs.length);
  result.stats = await page.$eval("#stats", (e) => e.textContent);

  // Regenerate the image answer, then edit the image question: the server's counters of prompt
  // tokens and of those taken from its caches, around each.
  const counters = async () => {
    const text = await (await fetch(base + "/metrics")).text();
    const value = (name) => Number(text.match(new RegExp("^" + name + "(?:\\{[^}]*\\})? (\\S+)$", "m"))[1]);
    return { prompt: value("vlm:prompt_tokens_total"), cached: value("vlm:prompt_tokens_cached_total") };
  };
  const delta = (a, b) => ({ prompt: b.prompt - a.prompt, cached: b.cached - a.cached });
  const count = () => page.evaluate(() => [".msg.user", ".msg.assistant"].map((s) => document.querySelectorAll(s).length));
  let before = await counters();
  await page.click("#regen");
  result.regenerated = await answer(2, "done");
  result.regenerate = { tokens: delta(before, await counters()), messages: await count() };
  before = await counters();
  await page.click("#edit");
  result.edit = { input: await page.$eval("#input", (e) => e.value), thumbs: await page.$$eval("#thumbs img", (i) => i.length),
                  messages: await count() };
  await page.$eval("#input", (e) => (e.value = ""));
  await page.type("#input", "What colour is this picture?");
  await page.click("#send");
  result.edited = await answer(2, "done");
  Object.assign(result.edit, { tokens: delta(before, await counters()), after: await count(),
                               user_images: await page.$$eval(".msg.user img", (imgs) => imgs.length) });

  await page.$eval("#max-tokens", (e) => (e.value = ""));  // until the model stops: long enough to stop it
  await page.type("#input", "Tell me a very long story.");
  await page.click("#send");
  await page.waitForFunction(() => {
    const a = document.querySelectorAll(".msg.assistant");
    return a.length >= 3 && a[2].textContent.length > 0;
  }, { timeout: 60000 });
  await page.click("#stop");
  result.answers.push(await answer(3, "stopped"));
  result.stats_stopped = await page.$eval("#stats", (e) => e.textContent);
  result.external_requests = external;
  await page.screenshot({ path: shot, fullPage: true });
} finally {
  await browser.close();
}
process.stdout.write(JSON.stringify(result));
