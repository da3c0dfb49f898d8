"""The "At scale" boxes: `<!-- at-scale: NAME -->` on a page becomes the record's table and reading for the
comparison NAME (proofs/scale_record.py COMPARISONS); `<!-- at-scale: all -->` the whole record. Every number
comes from bench/at_scale/*.json; without a record the box says so and how to make one."""

from __future__ import annotations

import re

from proofs import scale_record as R

MARK = re.compile(r"^(?P<indent>[ \t]*)<!-- at-scale: (?P<name>[\w-]+) -->[ \t]*$", re.M)


def _num(x: float, sd: float | None = None, n: int | None = None) -> str:
    s = f"{x:.3f}"
    if sd is not None:
        s += f" ± {sd:.3f}"
    if n is not None:
        s += f" <small>({n})</small>"
    return s.replace("-", "−")


def _signed(x: float) -> str:
    return f"{x:+.3f}".replace("-", "−")


def _status(record: dict) -> str:
    current = R.training_fingerprint()
    if record.get("training_fingerprint") == current:
        return ""
    return (" **The runner or the shared model has changed since this record was made** (training code "
            f"`{record.get('training_fingerprint')}`, now `{current}`): rerun `make at-scale` to refresh it.")


def provenance(record: dict, longer: dict | None, link: str) -> str:
    p, c = record["preset"], record["corpus"]
    text = (f"<small>`{p['name']}` preset: DecoderLM, d_model {p['d_model']}, {p['n_layers']} layers, {p['n_heads']} heads, "
            f"byte-level, context {p['context']}, {record['steps']} steps of {p['batch']} sequences "
            f"({record['tokens_per_run'] / 1e6:.1f}M bytes) per run; trained on {c['name']} "
            f"({c['bytes'] / 1e6:.1f} MB, held-out files {c['val_bytes'] / 1e6:.2f} MB); {record['device']}, torch "
            f"{record['torch']}, {record['date']}.")
    if longer:
        text += f" Second row per measurement: a longer run, {longer['steps']} steps (held-out loss only)."
    return text + f" ± is the sd over seeds, (n) the seeds. [How this was run]({link}).</small>" + _status(record)


def box(name: str, indent: str, link: str) -> str:
    """Markdown for one comparison, each line indented like the marker (so it sits inside its admonition)."""
    record, longer = R.records()
    if record is None:
        lines = ["*No at-scale record yet: run `make at-scale` (a GPU run takes about 8 minutes, the cpu preset about "
                 "30) and commit bench/at_scale/.*"]
    else:
        c = R.compare(record, name, longer)
        arms = [c["base"], *c["switches"]]
        head = ["measurement", f"{c['base_label']}"] + [R.ARM_LABELS.get(a, a) for a in c["switches"]]
        head += [f"{R.ARM_LABELS.get(a, a)} − {c['base_label']}" for a in c["switches"]]
        lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        for row in c["rows"]:
            cells = [f"{row['label']}, {c['steps']} steps"]
            cells += [_num(row["arms"][a]["mean"], row["arms"][a]["sd"], row["arms"][a]["n"]) if a in row["arms"] else "–"
                      for a in arms]
            cells += [f"{_signed(d['diff'])} ({R.z_text(d['z']).replace(' standard errors', ' se')}): **{d['reading']}**"
                      for d in row["diffs"].values()]
            lines.append("| " + " | ".join(cells) + " |")
            longs = [d.get("longer") for d in row["diffs"].values()]
            if any(longs) and longer:
                lb = [R.metric(longer["summary"], a, row["metric"]) for a in arms]
                cells = [f"same, {longer['steps']} steps"] + [_num(m["mean"], m["sd"], m["n"]) if m else "–" for m in lb]
                cells += [f"{_signed(x['diff'])} ({R.z_text(x['z']).replace(' standard errors', ' se')}): **{x['reading']}**"
                          if x else "–" for x in longs]
                lines.append("| " + " | ".join(cells) + " |")
        lines.append("")
        lines += [f"**{R.ARM_LABELS.get(sw, sw)}.** {say}" if len(c["switches"]) > 1 else say
                  for sw, _, say in R.verdict(c)]
        lines += ["", provenance(record, longer, link)]
    return "\n".join((indent + ln) if ln else "" for ln in lines) + "\n"


def whole(link_of) -> str:
    """The record page: every arm's measurements, and every comparison's reading with a link to its page."""
    record, longer = R.records()
    if record is None:
        return "*No at-scale record yet: run `make at-scale` and commit bench/at_scale/.*\n"
    s = record["summary"]
    keys = [("val", "held-out loss"), ("val_2x_beyond", "past 2x"), ("val_4x_beyond", "past 4x"),
            ("train_eval", "training loss"), ("accuracy", "accuracy"), ("ece", "ECE")]
    out = ["| arm | what it changes | parameters | " + " | ".join(k[1] for k in keys)
           + (f" | held-out loss, {longer['steps']} steps" if longer else "") + " |",
           "|" + "---|" * (3 + len(keys) + bool(longer))]
    for arm, a in record["arms"].items():
        if arm not in s:
            out.append(f"| `{arm}` | {a['what']} | – | " + " | ".join("failed or missing" for _ in keys) + " |")
            continue
        cells = [_num(s[arm][k]["mean"], s[arm][k]["sd"], len(s[arm][k]["values"])) if k in s[arm] else "–" for k, _ in keys]
        lng = longer and R.metric(longer["summary"], arm, "val")
        extra = [(_num(lng["mean"], lng["sd"], lng["n"]) if lng else "not run")] if longer else []
        out.append(f"| `{arm}` | {a['what']} | {s[arm]['params']:,} | " + " | ".join(cells + extra) + " |")
    out += ["", "| question | switch | reading |", "|---|---|---|"]
    for name, comp in R.COMPARISONS.items():
        c = R.compare(record, name, longer)
        for sw, key, say in R.verdict(c):
            out.append(f"| [{comp.page}]({link_of(comp.page)}) | {R.ARM_LABELS.get(sw, sw)} | **{key}**: {say} |")
    out += ["", provenance(record, longer, "#how-it-runs"), "",
            f"Corpus sha256 `{record['corpus']['sha256']}`; a model that learned only the byte frequencies scores "
            f"{record['corpus'].get('unigram_nats_val', float('nan')):.3f} nats/byte on the held-out files. "
            f"Training code `{record['training_fingerprint']}`."]
    if record.get("note"):
        out += ["", f"*Note on this record:* {record['note']}"]
    if longer and longer.get("note"):
        out += ["", f"*Note on the longer run:* {longer['note']}"]
    return "\n".join(out) + "\n"


def render(markdown: str, link_of) -> str:
    """Replace every at-scale marker; link_of(uri) gives a relative Markdown link to a docs page."""
    def one(m: re.Match) -> str:
        if m["name"] == "all":
            return whole(link_of)
        if m["name"] not in R.COMPARISONS:
            raise ValueError(f"at-scale marker names {m['name']!r}; known: all, {', '.join(R.COMPARISONS)}")
        return box(m["name"], m["indent"], link_of("at-scale.md"))
    return MARK.sub(one, markdown)
