// grove viewer: a trajectory's metadata and its timeline of steps, shared by the sandbox, trajectory and
// compare pages. Step outlines come a page at a time, grouped by phase (setup, the agent's, grading folded);
// each output is fetched only when it is expanded; a file step shows its text or its diff, line-numbered.
"use strict";

const timeline = (() => {
  const { el, path, getJSON, kv, badge, show } = grove;
  const PAGE = 250;
  const SHELLS = ["sh", "bash", "/bin/sh", "/bin/bash", "/usr/bin/bash"];

  function commandText(command) {
    if (Array.isArray(command)) {
      if (command.length === 3 && SHELLS.includes(command[0]) && (command[1] === "-c" || command[1] === "-lc")) {
        return String(command[2]);
      }
      return command.map((p) => (/^[\w@%+=:,./-]+$/.test(String(p)) ? String(p) : "'" + String(p).replace(/'/g, "'\\''") + "'")).join(" ");
    }
    return show(command);
  }

  function api(sid, ...rest) {
    return path("/ui/api/trajectories", sid, ...rest);
  }

  function output(sid, step, stream) {
    const info = step[stream] || {};
    if (!info.bytes && !info.kept) return null;
    const label = [stream, "(" + grove.bytes(info.bytes) + ")"];
    if (info.truncated) label.push("· truncated, " + grove.bytes(info.kept) + " kept");
    const box = el("details", { cls: "out " + stream, data: { stream: stream } }, el("summary", { text: label.join(" ") }));
    if (info.sha256) box.append(el("div", { cls: "muted mono", text: "sha256 " + info.sha256 }));
    if (info.truncated && info.artifact) {
      box.append(el("a", { cls: "full", href: api(sid, "steps", step.i, stream, "full"), text: "full " + stream + " (S3)" }));
      box.lastChild.setAttribute("target", "_blank");
      box.lastChild.setAttribute("rel", "noopener noreferrer");
    }
    let loaded = false;
    box.addEventListener("toggle", async () => {
      if (!box.open || loaded) return;
      loaded = true;
      const pre = el("pre", { cls: "term", text: "loading…" });
      box.append(pre);
      try {
        const got = await getJSON(api(sid, "steps", step.i, stream));
        pre.textContent = "";
        pre.append(grove.ansi(got.text));
        if (got.cut) box.append(el("div", { cls: "muted", text: "(the page shows the first 2,000,000 characters)" }));
      } catch (e) {
        pre.textContent = "could not load: " + e.message;
        loaded = false;
      }
    });
    return box;
  }

  function execStep(sid, step, node) {
    node.querySelector(".head").append(el("code", { cls: "cmd", text: commandText(step.command) }));
    const facts = el("div", { cls: "facts" });
    if (step.cwd) facts.append(el("span", { text: "cwd " + step.cwd }));
    if (step.user !== undefined && step.user !== null) facts.append(el("span", { text: "user " + show(step.user) }));
    if (step.exit_code !== undefined && step.exit_code !== null) {
      facts.append(el("span", { cls: step.exit_code === 0 ? "" : "bad", text: "exit " + step.exit_code }));
    }
    if (step.duration_s !== undefined) facts.append(el("span", { text: grove.seconds(step.duration_s) }));
    if (step.timed_out) facts.append(el("span", { cls: "bad", text: "timed out" }));
    if (step.error) facts.append(el("span", { cls: "bad", text: "call failed: " + show(step.error.status) + " " + show(step.error.body) }));
    node.append(facts);
    if (step.exit_code !== 0 || step.error || step.timed_out) node.classList.add("failed");
    for (const stream of ["stdout", "stderr"]) {
      const box = output(sid, step, stream);
      if (box) node.append(box);
    }
  }

  function content(value) {
    if (typeof value === "string") return value;
    if (Array.isArray(value)) {
      return value.map((part) => (part && typeof part === "object" && typeof part.text === "string" ? part.text : JSON.stringify(part))).join("\n");
    }
    return show(value);
  }

  function toolCall(name, args) {
    let text = args;
    if (typeof args === "string") {
      try { text = JSON.stringify(JSON.parse(args), null, 2); } catch (e) { text = args; }
    } else text = JSON.stringify(args, null, 2);
    return el("div", { cls: "call" }, el("span", { cls: "name", text: "→ " + show(name) }), el("pre", { cls: "json", text: text }));
  }

  function eventStep(step, node) {
    const data = step.data && typeof step.data === "object" ? step.data : {};
    node.querySelector(".kind").textContent = "event · " + show(step.kind);
    if (step.kind === "message") {
      const role = typeof data.role === "string" ? data.role : "message";
      const msg = el("div", { cls: "msg " + role.replace(/[^a-z]/g, "") }, el("span", { cls: "role", text: role }), content(data.content));
      for (const call of Array.isArray(data.tool_calls) ? data.tool_calls : []) {
        const fn = call && call.function ? call.function : call || {};
        msg.append(toolCall(fn.name, fn.arguments));
      }
      node.append(msg);
    } else if (step.kind === "tool_call") {
      node.append(toolCall(data.name, data.arguments || {}));
      if (data.output !== undefined && data.output !== null) node.append(el("div", { cls: "msg tool" }, el("span", { cls: "role", text: "tool output" }), content(data.output)));
    } else if (step.kind === "changes") {
      node.append(changes.brief(data));
    } else if ((step.kind === "setup" || step.kind === "grading") && typeof data.status === "string") {
      // A phase's bracket: what it says, on one line.
      const facts = el("div", { cls: "facts" }, el("span", { text: step.kind + " " + data.status }));
      for (const [k, v] of Object.entries(data)) if (k !== "status") facts.append(el("span", { text: k + " " + show(v) }));
      node.append(facts);
    } else if (step.kind === "tool_result") {
      node.append(el("div", { cls: "msg tool" }, el("span", { cls: "role", text: "tool " + show(data.tool_call_id || "") }), content(data.content)));
    } else {
      node.append(el("pre", { cls: "json", text: JSON.stringify(step.data, null, 2) }));
    }
  }

  function transferStep(sid, step, node) {
    node.classList.add("transfer");
    node.querySelector(".head").append(el("code", { cls: "cmd path", text: show(step.path) }));
    const facts = el("div", { cls: "facts" });
    if (step.size !== undefined) facts.append(el("span", { text: grove.bytes(step.size) }));
    if (step.sha256) facts.append(el("span", { cls: "mono", text: "sha256 " + step.sha256 }));
    if (step.status !== undefined) facts.append(el("span", { cls: step.status >= 400 ? "bad" : "", text: "HTTP " + step.status }));
    node.append(facts);
    if (step.file && typeof step.file === "object") fileView(sid, step, node, facts);
  }

  // A file's content (numbered lines), its diff against the record's earlier copy, or why it is not shown.
  function fileView(sid, step, node, facts) {
    const f = step.file;
    const against = "#" + show(f.against) + " (" + show(f.against_type).replace("_", " ") + ")";
    if (f.show === "binary") { facts.prepend(el("span", { cls: "kept", text: "binary: content not kept" })); return; }
    if (f.show === "large") { facts.prepend(el("span", { cls: "kept", text: "over " + grove.bytes(f.limit) + ": content not kept" })); return; }
    if (!["diff", "content", "same"].includes(f.show)) return;
    const draw = (body) => (f.show === "diff" ? code.diff(body) : code.listing(body));
    const view = el("div", { cls: "file-view" });
    const stat = el("span", { cls: "against" });
    // The whole text or diff, asked for when the outline has only its first lines (or, a costly diff, none).
    const whole = (label) => {
      const button = el("button", { cls: "all-lines", type: "button", text: label });
      button.addEventListener("click", async () => {
        button.disabled = true;
        try {
          const got = await getJSON(api(sid, "steps", step.i, "file"));
          view.replaceChildren(draw(got.body));
          if (got.show === "diff") described(got);
        } catch (e) {
          button.disabled = false;
          grove.showError("could not load the whole file: " + e.message);
        }
      });
      return button;
    };
    const described = (d) => {
      stat.replaceChildren(code.counts(d.added, d.removed), " against " + against);
      if (d.coarse) view.append(el("div", { cls: "muted", text: "(too many scattered changes to align line by line: the changed lines are shown as one replacement)" }));
    };
    if (f.deferred) {
      stat.textContent = "changed against " + against + " · " + f.lines + " lines";
      view.append(whole("Show the diff (many scattered changes: computed when asked)"));
    } else {
      view.append(draw(f.body));
      if (f.show === "diff") described(f);
      if (f.cut) view.append(whole("Show all " + f.lines + " lines"));
    }
    if (f.show === "diff") {
      facts.prepend(stat);
      node.append(view);
    } else {
      // A read, or a write of a file the record did not know before: the content, a write's open, a read's folded.
      const label = f.show === "same" ? "same content as " + against : "content";
      const box = el("details", { cls: "file-content" }, el("summary", { text: label + " · " + f.lines + " line" + (f.lines === 1 ? "" : "s") }), view);
      box.open = step.type === "file_write" && f.show === "content";
      node.append(box);
    }
  }

  function otherStep(step, node) {
    const rest = Object.fromEntries(Object.entries(step).filter(([k]) => !["i", "type", "t", "clipped"].includes(k)));
    node.append(el("pre", { cls: "json", text: JSON.stringify(rest, null, 2) }));
  }

  function renderStep(sid, step) {
    const type = String(step.type || "unknown");
    const node = el("article", { cls: "step " + type.replace(/[^a-z_]/g, ""), data: { i: step.i, type: type } },
      el("div", { cls: "head" }, el("span", { cls: "idx", text: "#" + step.i }), el("span", { cls: "kind", text: type.replace("_", " ") }),
        el("span", { cls: "muted", text: typeof step.t === "number" ? grove.when(step.t).slice(11) : "" })));
    if (type === "exec") execStep(sid, step, node);
    else if (type === "event") eventStep(step, node);
    else if (/^(file|archive)_/.test(type)) transferStep(sid, step, node);
    else if (type === "computer") filmstrip.row(sid, step, node);
    else if (type === "display") filmstrip.displayRow(step, node);
    else otherStep(step, node);
    if (step.clipped && !(type === "event" && step.kind === "changes")) {
      const more = el("button", { cls: "whole", type: "button", text: "show the whole step" });
      more.addEventListener("click", async () => {
        const whole = await getJSON(api(sid, "steps", step.i));
        const outline = Object.assign({}, whole, { i: step.i, clipped: false });
        if (type === "exec") Object.assign(outline, { stdout: step.stdout, stderr: step.stderr });
        if (step.file) Object.assign(outline, { file: step.file, content: undefined });
        outline.phase = step.phase;
        node.replaceWith(renderStep(sid, outline));
      });
      node.append(more);
    }
    return node;
  }

  function sandboxMeta(container, sandbox) {
    // The record's shape: task, model, harness and labels flat on the sandbox, as the recorder writes them
    // (the viewer's API gives live sandboxes and older records the same shape).
    const meta = sandbox;
    const labels = meta.labels && typeof meta.labels === "object" ? meta.labels : {};
    const res = sandbox.resources || {};
    const net = sandbox.network || {};
    container.textContent = "";
    kv(container, "Image", sandbox.image, { mono: true });
    kv(container, "Image digest", sandbox.image_digest, { mono: true });
    kv(container, "Task", meta.task_id);
    kv(container, "Model", meta.model);
    kv(container, "Harness", [meta.harness, meta.harness_version].filter((x) => x).join(" ") || null);
    kv(container, "Run", labels.run_id);
    kv(container, "Resources", "cpu " + show(res.cpu) + " · memory " + show(res.memory_mb) + " MB · pids " + show(res.pids_max) + " · disk " + show(res.disk_mb) + " MB");
    kv(container, "Network", show(net.egress) + (Array.isArray(net.allow) && net.allow.length ? " · allow " + net.allow.join(", ") : ""));
    kv(container, "Created", grove.when(sandbox.created_at));
    kv(container, "Ended", sandbox.ended_at ? grove.when(sandbox.ended_at) + (sandbox.end_reason ? " — " + sandbox.end_reason : "") : null);
    if (sandbox.error) kv(container, "Error", sandbox.error);
    const other = Object.entries(labels).filter(([k]) => k !== "run_id");
    if (other.length) kv(container, "Labels", other.map(([k, v]) => k + "=" + v).join(", "));
  }

  function outcome(container, out) {
    container.textContent = "";
    if (!out) { container.append(el("div", { cls: "result muted", text: "No outcome recorded (yet)." })); return null; }
    const result = el("div", { cls: "result", id: "outcome-result" }, badge(out.result), " ",
      el("span", { text: "reward " + show(out.reward) }), out.reason ? el("span", { cls: "muted", text: " — " + out.reason }) : null);
    container.append(result);
    const faults = Array.isArray(out.infra_errors) ? out.infra_errors : [];
    if (faults.length) {
      const box = el("div", { cls: "faults", id: "infra-faults" },
        el("h3", { text: "Infra faults (the environment's, not the policy's): " + faults.length }));
      const list = el("ul");
      for (const f of faults) list.append(el("li", { text: grove.when(f && f.t) + " — " + show(f && f.reason) }));
      box.append(list);
      container.append(box);
    }
    return out.result;
  }

  // Load a trajectory into `container` a page at a time; with follow, poll for new steps while it is live.
  function mount(container, sid, opts) {
    const o = opts || {};
    const state = { count: 0, total: 0, live: false, stopped: false };
    const more = el("button", { cls: "more", type: "button", id: "more-steps", text: "Show more steps" });
    const boxes = phases.boxes(container);
    more.hidden = true;
    container.after(more);

    async function load(offset) {
      const body = await getJSON(api(sid) + "?offset=" + offset + "&limit=" + PAGE);
      state.total = body.step_count;
      state.live = body.live;
      if (o.onHeader) o.onHeader(body);
      boxes.update(body);
      for (const step of body.steps) boxes.boxFor(step).append(renderStep(sid, step));
      state.count = offset + body.steps.length;
      more.hidden = state.count >= state.total || o.follow;
      more.textContent = "Show more steps (" + state.count + " of " + state.total + ")";
      return body;
    }

    more.addEventListener("click", () => load(state.count).catch((e) => grove.showError(e.message)));

    async function poll() {
      if (state.stopped) return;
      try {
        // Follow mode shows every step: catch up page by page, then wait for new ones.
        do { await load(state.count); } while (state.count < state.total);
      } catch (e) {
        grove.showError(e.message);
      }
      if (state.live && !state.stopped) setTimeout(poll, o.interval || 1500);
      else if (o.onEnd) o.onEnd();
    }

    if (o.follow) poll();
    else load(0).catch((e) => grove.showError(e.message));
    return { stop: () => { state.stopped = true; }, state };
  }

  return { renderStep, sandboxMeta, outcome, mount, commandText, api, PAGE };
})();
