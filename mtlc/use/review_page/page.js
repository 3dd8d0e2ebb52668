"use strict";
// The review page: the predictions (embedded as JSON by review.py) grouped by predicted class, a class
// chooser per image, filters, keyboard shortcuts, and a Save button that downloads labels.csv. Nothing
// else is ever written: decisions wait in this browser's localStorage until saved, each under its
// image's path and the hash of its bytes, so that a decision never passes to another picture saved
// later under the same name.
const data = JSON.parse(document.getElementById("review-data").textContent);
const storageKey = "mtlc-review:" + data.storage_key;
let decisions = {};
try { decisions = JSON.parse(localStorage.getItem(storageKey) || "{}"); } catch (e) { decisions = {}; }
const cards = [];
const asides = [];  // the audit's copies, leaks and strays, each with its "set aside" box
const SET_ASIDE = "set-aside";  // label.py's action for an image moved where training never looks
let selected = null;

function key(item) { return item.path + "\u0000" + (item.digest || ""); }
function asideKey(finding) { return SET_ASIDE + "\u0000" + key(finding); }

function remember() {
  try { localStorage.setItem(storageKey, JSON.stringify(decisions)); } catch (e) { /* a file:// page may refuse */ }
  const labeled = cards.filter(c => decisions[key(c.item)]);
  const corrected = labeled.filter(c => decisions[key(c.item)] !== c.item.label).length;
  const aside = asides.filter(a => decisions[asideKey(a.finding)]).length;
  document.getElementById("decided").textContent =
    `${labeled.length} decided (${labeled.length - corrected} confirmed, ${corrected} corrected)` +
    (asides.length ? `, ${aside} set aside` : "");
}

function decide(card, label) {
  if (label) decisions[key(card.item)] = label; else delete decisions[key(card.item)];
  show(card);
  remember();
}

function show(card) {
  const label = decisions[key(card.item)];
  card.select.value = label || "";
  card.el.classList.toggle("decided", Boolean(label));
  card.el.classList.toggle("corrected", Boolean(label) && label !== card.item.label);
}

function makeCard(item) {
  const el = document.createElement("div");
  el.className = "card" + (item.accepted === true ? " accepted" : item.accepted === false ? " uncertain" : "");
  el.dataset.path = item.path;
  el.tabIndex = -1;
  const img = document.createElement("img");
  img.src = item.thumb;
  img.alt = item.name;
  img.title = item.path;
  const name = document.createElement("div");
  name.className = "name";
  name.textContent = item.name;
  const info = document.createElement("div");
  info.className = "confidence";
  info.textContent = item.given ?  // a doubtful label (evaluate.py --audit): its class, and the one suggested
    `labeled ${item.given} (${(100 * item.confidence).toFixed(1)}%) → ${item.label}?` :
    `${item.label} ${(100 * item.confidence).toFixed(1)}%` + (item.runner_up ? ` · ${item.runner_up}?` : "") +
    (item.like_no_class ? " · like no class" : "");  // farther from the labeled images than they lie apart
  const select = document.createElement("select");
  select.setAttribute("aria-label", "class of " + item.name);
  select.add(new Option("— undecided —", ""));
  data.classes.forEach((c, i) => select.add(new Option((i < 10 ? `${(i + 1) % 10} ` : "") + c + (c === item.label ? " ✓" : ""), c)));
  el.append(img, name, info, select);
  const card = {item, el, select};
  select.addEventListener("change", () => decide(card, select.value));
  el.addEventListener("click", ev => { if (ev.target !== select) choose(card); });
  show(card);
  return card;
}

function choose(card) {
  if (selected) selected.el.classList.remove("selected");
  selected = card;
  if (card) { card.el.classList.add("selected"); card.el.scrollIntoView({block: "nearest"}); }
}

function render() {
  const groups = document.getElementById("groups");
  const filter = document.getElementById("class-filter");
  data.classes.forEach(c => filter.add(new Option(c, c)));
  for (const c of data.classes) {
    const items = data.items.filter(it => it.label === c);
    if (!items.length) continue;
    const section = document.createElement("section");
    section.className = "group";
    section.dataset.label = c;
    const [shown, total] = data.shown[c];
    const h = document.createElement("h2");
    h.textContent = `${c}: ${total} image${total === 1 ? "" : "s"}` +
      (shown < total ? ` (the ${shown} least confident shown)` : "") +
      (data.audit ? ` labeled otherwise, most doubtful first` :
        items.some(it => it.like_no_class) ? ", those like no class first, then the least confident" :
        ", least confident first");
    const grid = document.createElement("div");
    grid.className = "grid";
    for (const item of items) { const card = makeCard(item); cards.push(card); grid.append(card.el); }
    section.append(h, grid);
    groups.append(section);
  }
  renderFindings();
  const failed = document.getElementById("failed");
  for (const f of data.failed) { const li = document.createElement("li"); li.textContent = `${f.path}: ${f.reason}`; failed.append(li); }
  document.getElementById("failed-section").hidden = !data.failed.length;
  document.getElementById("threshold").textContent = data.max_error === null ? "no --max-error given" :
    data.threshold === null ? `none: no confidence keeps the error at most ${data.max_error}%` :
    `confidence at least ${data.threshold.toFixed(4)}, --max-error ${data.max_error}%`;
  document.getElementById("summary").textContent = data.summary;
  if (data.audit) {  // evaluate.py --audit: each card a label in doubt, its chooser set to the class suggested
    document.getElementById("confirm-what").textContent =
      "the suggested class is right (label.py moves the image to it)";
    document.getElementById("legend").hidden = true;
  }
}

function thumbnail(src, name) {
  const img = document.createElement("img");
  img.src = src;
  img.alt = name;
  img.title = name;
  return img;
}

// The copies (those under two classes among them), the leaks into test/ and the images like no class that an audit found, each with a box
// that sets it aside (label.py moves it into set-aside/, where training never looks).
function renderFindings() {
  const list = document.getElementById("findings");
  for (const f of data.findings) {
    const row = document.createElement("div");
    row.className = "finding " + f.kind;
    row.dataset.path = f.path;
    const what = document.createElement("div");
    what.className = "name";
    what.textContent = `${f.kind}: ${f.path}` + (f.copy ? ` = ${f.copy}` : "") + ` (${f.detail})`;
    const box = document.createElement("input");
    box.type = "checkbox";
    box.className = "aside";
    box.checked = Boolean(decisions[asideKey(f)]);
    box.addEventListener("change", () => {
      if (box.checked) decisions[asideKey(f)] = SET_ASIDE; else delete decisions[asideKey(f)];
      remember();
    });
    const label = document.createElement("label");
    // A conflict is one image under two classes: one of the two is wrong, neither is a spare copy.
    label.append(box, f.kind === "leak" ? " set this test image aside"
      : f.kind === "conflict" ? " set this one aside (or fix the wrong label with label.py)" : " set aside");
    if (f.thumb) row.append(thumbnail(f.thumb, f.name));
    if (f.copy_thumb) row.append(thumbnail(f.copy_thumb, f.copy));
    row.append(what, label);
    list.append(row);
    asides.push({finding: f, box});
  }
  document.getElementById("findings-section").hidden = !data.findings.length;
}

function visible(card) {
  const cls = document.getElementById("class-filter").value;
  const lo = parseFloat(document.getElementById("min-confidence").value) || 0;
  const hiText = document.getElementById("max-confidence").value;
  const hi = hiText === "" ? 1 : parseFloat(hiText);
  const status = document.getElementById("status-filter").value;
  const it = card.item;
  return (!cls || it.label === cls) && it.confidence >= lo && it.confidence <= hi &&
    (!status || (status === "accepted" && it.accepted === true) || (status === "uncertain" && it.accepted !== true) ||
     (status === "undecided" && !decisions[key(it)]));
}

function applyFilters() {
  for (const card of cards) card.el.hidden = !visible(card);
  for (const section of document.querySelectorAll("section.group")) {
    section.hidden = !section.querySelector(".card:not([hidden])");
  }
  if (selected && selected.el.hidden) choose(null);
}

function csvField(s) { return /[",\n\r]/.test(s) ? '"' + s.replace(/"/g, '""') + '"' : s; }

function save() {
  const row = (item, label, action) => [item.path, label, item.digest || "", action].map(csvField).join(",");
  const rows = cards.filter(c => decisions[key(c.item)]).map(c => row(c.item, decisions[key(c.item)], "label"))
    .concat(asides.filter(a => decisions[asideKey(a.finding)]).map(a => row(a.finding, "", SET_ASIDE)));
  const blob = new Blob(["path,label,blake2b,action\r\n" + rows.map(r => r + "\r\n").join("")], {type: "text/csv"});
  const a = document.createElement("a");
  a.href = URL.createObjectURL(blob);
  a.download = "labels.csv";
  document.body.append(a);
  a.click();
  a.remove();
}

function move(step) {
  const shown = cards.filter(c => !c.el.hidden);
  if (!shown.length) return;
  const at = selected ? shown.indexOf(selected) : -1;
  choose(shown[Math.max(0, Math.min(shown.length - 1, at + step))]);
}

document.addEventListener("keydown", ev => {
  if (ev.target.tagName === "INPUT" || ev.target.tagName === "SELECT" || ev.ctrlKey || ev.metaKey || ev.altKey) return;
  if (ev.key === "ArrowRight" || ev.key === "ArrowDown" || ev.key === "j") { move(1); ev.preventDefault(); return; }
  if (ev.key === "ArrowLeft" || ev.key === "ArrowUp" || ev.key === "k") { move(-1); ev.preventDefault(); return; }
  if (!selected) return;
  if (ev.key === "Enter" || ev.key === "y") { decide(selected, selected.item.label); move(1); }
  else if (/^[0-9]$/.test(ev.key)) {
    const index = (parseInt(ev.key, 10) + 9) % 10;
    if (index < data.classes.length) { decide(selected, data.classes[index]); move(1); }
  } else if (ev.key === "Backspace" || ev.key === "Delete") decide(selected, "");
  else return;
  ev.preventDefault();
});

render();
for (const id of ["class-filter", "min-confidence", "max-confidence", "status-filter"]) {
  document.getElementById(id).addEventListener("input", applyFilters);
  document.getElementById(id).addEventListener("change", applyFilters);
}
document.getElementById("save").addEventListener("click", save);
remember();
applyFilters();
