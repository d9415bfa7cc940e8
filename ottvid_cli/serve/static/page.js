// The page of `ottvid serve`: one video, questions about it, what compression did.
// It talks only to this server's own API (docs/serve.md): GET /v1/ottvid/info and /v1/ottvid/media,
// POST /v1/chat/completions with "stream": true (server-sent events, OpenAI's chunks; the last one
// carries the `ottvid` object). No framework, no build step: this file is what runs.
"use strict";

(function () {
  const $ = (id) => document.getElementById(id);
  const KEY_STORE = "ottvid-api-key";
  const CACHED = ["decode", "preprocess", "vision", "saliency"]; // the stages a cache hit skips
  const state = {
    needsKey: document.body.dataset.apiKey === "required",
    key: null,
    info: null,
    video: null, // {kind: "upload", name, file, url (data:)} or {kind: "media", name, url (file://)}
    objectUrl: null,
    duration: null, // seconds, from the player (or the server's frames report)
    span: undefined, // the ground answer's [start, end] seconds; null: none; undefined: no ground answer
    controller: null,
    shown: null, // {key, picture}: the last picture drawn, and the video and settings it shows
  };
  try {
    state.key = sessionStorage.getItem(KEY_STORE);
  } catch (e) {
    state.key = null; // storage refused (private mode): ask each time
  }

  // ---------------------------------------------------------------------------------------------
  // talking to the API

  class ApiError extends Error {
    constructor(message, status, code) {
      super(message);
      this.status = status;
      this.code = code;
    }
  }

  function headers(extra) {
    const h = Object.assign({}, extra || {});
    if (state.key) h.Authorization = "Bearer " + state.key;
    return h;
  }

  async function failure(response) {
    let message = "the server answered " + response.status + " " + response.statusText;
    let code = null;
    try {
      const body = await response.json();
      if (body && body.error && body.error.message) {
        message = body.error.message;
        code = body.error.code || null;
      }
    } catch (e) {
      // not JSON: keep the status line
    }
    return new ApiError(message, response.status, code);
  }

  async function getJson(path) {
    let response;
    try {
      response = await fetch(path, { headers: headers() });
    } catch (e) {
      throw new ApiError("cannot reach the server: " + e.message, 0, "unreachable");
    }
    if (!response.ok) throw await failure(response);
    return response.json();
  }

  // ---------------------------------------------------------------------------------------------
  // messages

  function showError(message) {
    const box = $("error");
    box.textContent = message;
    box.hidden = false;
  }

  function clearError() {
    $("error").hidden = true;
    $("error").textContent = "";
  }

  function handle(error) {
    if (error instanceof ApiError && error.status === 401) {
      askForKey(error.message); // said under the key, where it is fixed
      return;
    }
    showError(error.message || String(error));
  }

  // ---------------------------------------------------------------------------------------------
  // the key

  function askForKey(message) {
    $("key-form").hidden = false;
    $("key-error").textContent = message || "";
    $("key-error").hidden = !message;
    $("api-key").focus();
  }

  $("key-form").addEventListener("submit", (event) => {
    event.preventDefault();
    state.key = $("api-key").value.trim();
    try {
      sessionStorage.setItem(KEY_STORE, state.key);
    } catch (e) {
      // kept in memory only
    }
    connect();
  });

  // ---------------------------------------------------------------------------------------------
  // what the server offers

  async function connect() {
    clearError();
    if (state.needsKey && !state.key) {
      $("model").textContent = "needs the API key";
      askForKey();
      return;
    }
    try {
      state.info = await getJson("/v1/ottvid/info");
    } catch (error) {
      $("model").textContent = "not connected";
      handle(error);
      return;
    }
    $("key-form").hidden = true;
    $("key-error").hidden = true;
    const info = state.info;
    $("model").textContent = info.model;
    $("model").title = info.model;
    fill($("method"), info.methods, $("method").value || "ottvid");
    const task = $("task");
    for (const option of task.options) option.disabled = !info.tasks.includes(option.value);
    if (!info.tasks.includes("ground")) task.title = "ground needs a Qwen2.5-VL model";
    $("frames").placeholder = info.frames ? "default (" + info.frames + ")" : "default";
    updateTokenHint();
    showWarmUp(info);
    if (info.media_folder) await listMedia();
    document.body.dataset.ready = "true"; // connected: the controls are filled (a hook for scripts)
  }

  // The model's warm-up runs once, when the server starts: said beside the model, never in a question's
  // time. A page opened while it runs says so, and asks again until it has run.
  const WARM_POLL_MS = 1000;
  let warmPoll = null;

  function showWarmUp(info) {
    clearTimeout(warmPoll);
    if (info.ready === false) {
      $("warmup").textContent = "warming up…";
      warmPoll = setTimeout(pollWarmUp, WARM_POLL_MS);
      return;
    }
    const warm = info.warmup_ms;
    $("warmup").textContent = Number.isFinite(warm) ? "warmed up at start in " + Math.round(warm) + " ms" : "";
  }

  async function pollWarmUp() {
    try {
      showWarmUp(await getJson("/v1/ottvid/info"));
    } catch (error) {
      if (error instanceof ApiError && error.status === 401) return handle(error); // asks for the key
      warmPoll = setTimeout(pollWarmUp, WARM_POLL_MS); // not reachable for now: ask again later
    }
  }

  function fill(select, values, chosen) {
    select.replaceChildren(...values.map((value) => new Option(value, value, false, value === chosen)));
  }

  async function listMedia() {
    let listing;
    try {
      listing = await getJson("/v1/ottvid/media");
    } catch (error) {
      handle(error);
      return;
    }
    const select = $("media-list");
    const options = [new Option(listing.data.length ? "choose a video…" : "(no videos in the folder)", "")];
    for (const item of listing.data) {
      const option = new Option(item.name + "  (" + megabytes(item.bytes) + ")", item.name);
      option.dataset.url = item.url;
      options.push(option);
    }
    select.replaceChildren(...options);
    $("media-pick").hidden = false;
  }

  // ---------------------------------------------------------------------------------------------
  // the video

  function megabytes(bytes) {
    return (bytes / (1 << 20)).toFixed(bytes < 10 << 20 ? 2 : 1) + " MB";
  }

  function play(src) {
    if (state.objectUrl) URL.revokeObjectURL(state.objectUrl);
    state.objectUrl = src.startsWith("blob:") ? src : null;
    state.duration = null;
    $("t-end").textContent = ""; // not the last video's: the player, or the server's reply, says this one's
    $("playhead").style.left = "0";
    drawSpan(undefined);
    $("player").src = src;
    document.body.classList.add("has-video");
  }

  function readAsDataUrl(file) {
    return new Promise((resolve, reject) => {
      const reader = new FileReader();
      reader.onload = () => resolve(reader.result);
      reader.onerror = () => reject(new Error("cannot read " + file.name));
      reader.readAsDataURL(file);
    });
  }

  $("video-file").addEventListener("change", async () => {
    clearError();
    const file = $("video-file").files[0];
    if (!file) return;
    $("media-list").value = "";
    const cap = state.info ? state.info.max_upload_bytes : null;
    if (cap !== null && file.size > cap) {
      state.video = null;
      $("video-name").textContent = "";
      document.body.classList.remove("has-video");
      $("player").removeAttribute("src");
      showError("the uploaded video is larger than the server's limit (" + megabytes(cap) + ", --max-upload-mb): " +
                file.name + " is " + megabytes(file.size));
      return;
    }
    play(URL.createObjectURL(file));
    $("video-name").textContent = file.name + " (" + megabytes(file.size) + ", uploaded with each question)";
    const video = (state.video = { kind: "upload", name: file.name, file: file, url: null });
    try {
      const url = await readAsDataUrl(file);
      if (state.video === video) video.url = url; // not if another video was chosen meanwhile
    } catch (error) {
      if (state.video === video) state.video = null;
      showError(error.message);
    }
  });

  $("media-list").addEventListener("change", async () => {
    clearError();
    const select = $("media-list");
    const option = select.selectedOptions[0];
    if (!option || !option.value) return;
    $("video-file").value = "";
    const name = option.value;
    const video = (state.video = { kind: "media", name: name, url: option.dataset.url });
    $("video-name").textContent = name + " (on the server)";
    const path = "/v1/ottvid/media/" + name.split("/").map(encodeURIComponent).join("/");
    if (!state.key) {
      play(path); // the player reads it directly, with Range requests
      return;
    }
    try { // a <video> cannot send the key: fetch it, then play the copy
      const response = await fetch(path, { headers: headers() });
      if (!response.ok) throw await failure(response);
      const blob = await response.blob();
      if (state.video === video) play(URL.createObjectURL(blob));
    } catch (error) {
      handle(error);
    }
  });

  const player = $("player");
  player.addEventListener("loadedmetadata", () => {
    if (Number.isFinite(player.duration)) state.duration = player.duration;
    $("t-end").textContent = clock(state.duration);
    if (state.span !== undefined) drawSpan(state.span); // drawn again at the player's own duration
  });
  player.addEventListener("timeupdate", () => {
    $("t-now").textContent = clock(player.currentTime);
    const d = state.duration;
    $("playhead").style.left = d ? Math.min(100, (100 * player.currentTime) / d) + "%" : "0";
  });
  player.addEventListener("error", () => {
    if (state.video) $("video-name").textContent += " (this browser cannot play it)";
  });

  function clock(seconds) {
    if (seconds === null || !Number.isFinite(seconds)) return "";
    const m = Math.floor(seconds / 60);
    const s = seconds - 60 * m;
    return m + ":" + (s < 10 ? "0" : "") + s.toFixed(1);
  }

  function seek(seconds) {
    if (!Number.isFinite(seconds)) return;
    player.currentTime = seconds;
  }

  $("timeline").addEventListener("click", (event) => {
    if (!state.duration || event.target === $("span")) return;
    const box = $("timeline").getBoundingClientRect();
    seek(((event.clientX - box.left) / box.width) * state.duration);
  });
  $("span").addEventListener("click", () => {
    if (state.span) seek(state.span[0]);
  });

  // the span of a ground answer on the timeline: undefined hides it, null says "no span"
  function drawSpan(span) {
    const bar = $("span");
    state.span = span;
    if (span === undefined) {
      bar.hidden = true;
      bar.dataset.state = "";
      return;
    }
    bar.hidden = false;
    if (span === null) {
      bar.dataset.state = "none";
      bar.textContent = "no span";
      bar.title = "The model named no time span";
      bar.style.left = "0";
      bar.style.width = "100%";
      return;
    }
    const d = state.duration || span[1] || 1;
    const left = Math.max(0, Math.min(1, span[0] / d));
    const right = Math.max(left, Math.min(1, span[1] / d));
    bar.dataset.state = "span";
    bar.dataset.start = String(span[0]);
    bar.dataset.end = String(span[1]);
    // a moment (ottvid.point) is the span [t, t]: one time
    bar.textContent = span[0] === span[1] ? span[0].toFixed(1) + " s"
      : span[0].toFixed(1) + "–" + span[1].toFixed(1) + " s";
    bar.title = "Click to play from " + span[0].toFixed(2) + " s";
    bar.style.left = 100 * left + "%";
    bar.style.width = "max(" + 100 * (right - left) + "%, 4px)";
  }

  // ---------------------------------------------------------------------------------------------
  // asking

  function updateTokenHint() {
    const info = state.info;
    const task = $("task").value;
    if (info && info.max_tokens) $("max-tokens").placeholder = "default (" + info.max_tokens[task] + ")";
    $("choices-box").hidden = task !== "ask";
    $("point-box").hidden = task !== "ground";
    $("answer-label").textContent = task === "ask" ? "Answer" : "The model said";
  }
  $("task").addEventListener("change", updateTokenHint);

  function number(id) {
    const text = $(id).value.trim();
    return text === "" ? null : Number(text);
  }

  // what the picture depends on: the video, the sampling (the task's default, or frames) and the compression
  function pictureKey(ottvid) {
    const v = state.video;
    const video = v.kind === "upload" ? [v.name, v.file.size, v.file.lastModified] : [v.name];
    return JSON.stringify([v.kind, video, ottvid.frames === undefined ? ottvid.task : ottvid.frames, ottvid.method,
      ottvid.ratio]);
  }

  function request(question) {
    const task = $("task").value;
    const ottvid = { task: task, method: $("method").value };
    const ratio = number("ratio");
    if (ratio !== null) ottvid.ratio = ratio;
    const frames = number("frames");
    if (frames !== null) ottvid.frames = frames;
    // the server draws the picture only when it would differ from the one on the page
    ottvid.picture = !state.shown || state.shown.key !== pictureKey(ottvid);
    const choices = $("choices").value.split("\n").map((s) => s.trim()).filter((s) => s);
    if (task === "ask" && choices.length) ottvid.choices = choices;
    if (task === "ground" && $("point").checked) ottvid.point = true; // ground --point: one moment
    const body = {
      model: state.info.model,
      stream: true,
      messages: [{ role: "user", content: [
        { type: "video_url", video_url: { url: state.video.url } },
        { type: "text", text: question },
      ] }],
      ottvid: ottvid,
    };
    const maxTokens = number("max-tokens");
    if (maxTokens !== null) body.max_tokens = maxTokens;
    return body;
  }

  function busy(on) {
    $("submit").disabled = on;
    $("stop").hidden = !on;
    document.body.classList.toggle("busy", on);
  }

  function resetResults() {
    $("answer").textContent = "";
    $("answer").classList.remove("done");
    for (const id of ["cache", "tokens", "timings"]) $(id).replaceChildren();
    $("picture-box").hidden = true;
    $("picture").removeAttribute("src");
    $("picture-words").replaceChildren();
    drawSpan(undefined);
  }

  // the server-sent events of one reply: calls onChunk with each parsed `data:` object
  async function readEvents(response, onChunk) {
    const reader = response.body.getReader();
    const decoder = new TextDecoder();
    let buffer = "";
    for (;;) {
      const { value, done } = await reader.read();
      buffer += decoder.decode(value || new Uint8Array(), { stream: !done });
      let cut;
      while ((cut = buffer.search(/\r?\n\r?\n/)) >= 0) {
        const event = buffer.slice(0, cut);
        buffer = buffer.slice(cut).replace(/^\r?\n\r?\n/, "");
        const data = event.split(/\r?\n/).filter((l) => l.startsWith("data:")).map((l) => l.slice(5).trimStart())
          .join("\n");
        if (!data) continue;
        if (data === "[DONE]") return;
        onChunk(JSON.parse(data));
      }
      if (done) return;
    }
  }

  async function ask(event) {
    event.preventDefault();
    if (state.controller) return; // one question at a time; Stop cancels it
    clearError();
    const question = $("question").value.trim();
    if (!state.info) {
      await connect();
      if (!state.info) return;
    }
    if (!state.video || !state.video.url) {
      showError(state.video ? "the video is still being read, try again in a moment"
        : "choose a video first: upload one, or pick one on the server");
      return;
    }
    if (!question) {
      showError("the question is empty");
      return;
    }
    resetResults();
    busy(true);
    const controller = (state.controller = new AbortController());
    let run = null;
    let finish = null;
    const body = request(question);
    const key = pictureKey(body.ottvid);
    try {
      const response = await fetch("/v1/chat/completions", {
        method: "POST",
        headers: headers({ "Content-Type": "application/json", Accept: "text/event-stream" }),
        body: JSON.stringify(body),
        signal: controller.signal,
      });
      if (!response.ok) throw await failure(response);
      await readEvents(response, (chunk) => {
        if (chunk.error) throw new ApiError(chunk.error.message, 500, chunk.error.code);
        const choice = chunk.choices && chunk.choices[0];
        if (choice && choice.delta && choice.delta.content) $("answer").textContent += choice.delta.content;
        if (chunk.ottvid) run = chunk.ottvid;
        if (choice && choice.finish_reason) finish = choice.finish_reason;
      });
      if (!run) throw new ApiError("the reply ended before the answer was complete", 0, "incomplete");
      if (body.ottvid.picture) state.shown = { key: key, picture: run.picture };
      render(run, finish, state.shown ? state.shown.picture : null, Boolean(body.ottvid.choices));
    } catch (error) {
      if (error.name === "AbortError") stopped();
      else if (error instanceof TypeError) showError("cannot reach the server (" + error.message + ")");
      else handle(error);
    } finally {
      controller.abort(); // a no-op once the reply is read; otherwise the server stops the job
      state.controller = null;
      busy(false);
    }
  }

  // the person pressed Stop: a note in the answer's place, not an error
  function stopped() {
    const answer = $("answer");
    answer.classList.add("done");
    item(answer, "stopped", "you pressed Stop; the server stopped working on it", "stopped");
  }

  $("ask-form").addEventListener("submit", ask);
  $("stop").addEventListener("click", () => {
    if (state.controller) state.controller.abort();
  });

  // ---------------------------------------------------------------------------------------------
  // what the run did

  function item(parent, label, value, cls) {
    const row = document.createElement("div");
    row.className = "item" + (cls ? " " + cls : "");
    const k = document.createElement("span");
    k.className = "k";
    k.textContent = label;
    const v = document.createElement("span");
    v.className = "v";
    v.textContent = value;
    row.append(k, v);
    parent.append(row);
    return row;
  }

  function render(run, finish, picture, choices) {
    const answer = $("answer");
    answer.textContent = run.answer || "(empty answer)";
    answer.classList.add("done");
    if (run.letter) item(answer, "choice", run.letter, "letter");
    else if (choices) item(answer, "choice", "no option letter could be read from the reply", "letter none");
    if (run.task === "ground" && !Array.isArray(run.span)) {
      item(answer, "no time span", run.span_note || "none could be read from the reply", "nospan");
    }
    if (finish === "length") item(answer, "note", "cut at the token limit (Max tokens)", "cut");

    const cache = $("cache");
    cache.dataset.hit = run.cache_hit ? "true" : "false";
    cache.className = "fact " + (run.cache_hit ? "hit" : "miss");
    cache.textContent = run.cache_hit
      ? "Cache hit: this video was already prepared (decoding and the vision encoder skipped)"
      : "Cache miss: the video was decoded, encoded and compressed for this question";

    const t = run.tokens || {};
    const tokens = $("tokens");
    const heading = document.createElement("h2");
    heading.textContent = "Tokens";
    tokens.append(heading);
    if (t.visual_before !== undefined) {
      const share = t.visual_before ? (100 * t.visual_after) / t.visual_before : 0;
      item(tokens, "visual", t.visual_before.toLocaleString("en") + " → " + t.visual_after.toLocaleString("en") +
           " (" + share.toFixed(1) + "%)");
    }
    if (t.llm_input !== undefined) item(tokens, "LLM input", t.llm_input.toLocaleString("en"));
    if (t.generated !== undefined) item(tokens, "generated", String(t.generated));
    const f = run.frames || {};
    if (f.count !== undefined) item(tokens, "frames", f.count + (f.duration ? " over " + f.duration.toFixed(1) + " s" : ""));
    item(tokens, "method", run.method + (run.method === "none" ? "" : " at ratio " + run.ratio));

    const timings = $("timings");
    const title = document.createElement("h2");
    title.textContent = "Timings (ms)";
    timings.append(title);
    let total = 0;
    for (const [stage, ms] of Object.entries(run.timings_ms || {})) {
      // the model's loading and warm-up happened once, at the server's start: not this request's time
      if (stage === "load" || stage === "warmup" || ms === null || ms === undefined) continue;
      if (run.cache_hit && CACHED.includes(stage)) { // not run: the video came from the cache
        item(timings, stage, "cached");
        continue;
      }
      total += ms;
      item(timings, stage, ms.toFixed(ms < 10 ? 1 : 0));
    }
    item(timings, "total", total.toFixed(0), "total");

    if (picture && picture.image) {
      $("picture").src = picture.image;
      $("picture-caption").textContent = "What compression kept: " + picture.kept + " of " + picture.total +
        " visual tokens, " + picture.groups + " frame groups" + (picture.every > 1 ? " (1 in " + picture.every +
        " shown)" : "") + ". Click the picture to zoom.";
      pictureWords(picture.words);
      $("picture-box").hidden = false;
    } else if (picture && picture.error) {
      $("picture-caption").textContent = picture.error;
      $("picture-box").hidden = false;
    }

    if (!state.duration && run.frames && run.frames.duration) { // a video this browser cannot play (AVI)
      state.duration = run.frames.duration;
      $("t-end").textContent = clock(state.duration);
    }
    if (run.task === "ground") {
      drawSpan(Array.isArray(run.span) ? run.span : null);
      if (!Array.isArray(run.span) && run.span_note) $("span").title = "No span: " + run.span_note;
    }
  }

  // what the picture says, as text under it: readable at any width (on a phone the picture's own
  // lettering is a few pixels high)
  function pictureWords(words) {
    const box = $("picture-words");
    box.replaceChildren();
    if (!words) return;
    const add = (tag, text) => {
      const node = document.createElement(tag);
      node.textContent = text;
      return node;
    };
    if (words.header) box.append(add("p", words.header));
    const legend = words.legend || [];
    if (legend.length) {
      const list = add("ul", "");
      for (const text of legend.slice(1)) list.append(add("li", text));
      box.append(add("p", legend[0]), list);
    }
    for (const text of words.budget || []) box.append(add("p", text));
  }

  $("picture").addEventListener("click", () => $("picture-box").classList.toggle("zoom"));

  connect();
})();
