"""The report's `explain` section, rendered from the six explain tables (localize, evidence, lint, remedies, noise,
latency): every explain command appends to its table and then re-renders the section from all six
(``update_report``), so the commands can run in any order and none overwrites another's findings."""

from __future__ import annotations

import json
from pathlib import Path

from quantbench.report import document
from quantbench.store import partread
from quantbench.textfmt import md_section, md_table, num

SECTION = document.registered("explain")


def _rows(name: str, root) -> list[dict]:
    return partread.read(name, root=root).to_pylist()


def render(tables_root) -> str:
    """The explain section's Markdown, from the six explain tables under `tables_root`."""
    lines = ["## Explaining divergences (`quantbench localize / lint / remedy / noise / latency`)", ""]
    for table, part in _PARTS:
        rows = _rows(table, tables_root)
        if rows:
            lines += part(rows)
    return "\n".join(lines)


def _localize_lines(loc: list[dict]) -> list[str]:
    """First divergent node per localize run."""
    rows = []
    for lid in sorted({r["localize_id"] for r in loc}):
        rs = [r for r in loc if r["localize_id"] == lid]
        first = [r for r in rs if r["first_divergent"]]
        outs = [r for r in rs if r["is_output"]]
        r0 = rs[0]
        rows.append([r0["variant"], f"{r0['host_a']} vs {r0['host_b']}", r0["fixture_id"][:12], r0["opt_level"],
                     r0["group_size"], sum(1 for r in rs if not r["observable"]),
                     f"{first[0]['node']} ({first[0]['op_type']})" if first else "none",
                     num(min((r["bits_min"] for r in first if r["bits_min"] is not None), default=None), ".4g", None),
                     ", ".join(f"{r['tensor']}: {'same' if r['same'] else 'differs'} "
                               f"(bits min {num(r['bits_min'], '.4g', None)})" for r in outs)])
    return md_section("First divergent node (`localize`)",
                      "Every intermediate hashed per host in topological order, a group of K at a time; only the "
                      "first divergent node's tensors and the outputs are fetched to measure remaining precision.",
                      ["variant", "hosts", "fixture", "level", "K", "not observable", "first divergent node",
                       "bits min there", "outputs"], rows)


def _evidence_lines(ev: list[dict]) -> list[str]:
    """Instruction families per emulated host."""
    hosts = sorted({(r["host"], r["qemu_cpu"], r["variant"]) for r in ev})
    fams = sorted({r["family"] for r in ev})
    rows = []
    for h, cpu, v in hosts:
        counts = {r["family"]: r["sites"] for r in ev if (r["host"], r["qemu_cpu"], r["variant"]) == (h, cpu, v)}
        rows.append([h, cpu, v] + [counts.get(f, 0) for f in fams])
    return md_section("Kernel evidence (qemu `-d in_asm`)",
                      "Distinct instruction sites inside onnxruntime's code per family (translations, not executions).",
                      ["host", "qemu cpu", "variant"] + fams, rows)


def _lint_lines(lint: list[dict]) -> list[str]:
    """Integer weights some host tier can diverge on."""
    risky = [r for r in lint if r["tiers"]]
    lines = ["### Saturation lint", "",
             f"{len(lint)} int8 weight tensor(s) linted, {len(risky)} that some host tier can diverge on.", ""]
    if risky:
        lines += md_table(["model", "layer", "op", "K", "act/weight", "x86 sat pairs", "neon wrap pairs", "int32",
                           "tiers"],
                          [[Path(r["model"]).name, r["node"], r["op_type"], r["k"], f"{r['act_type']}/{r['weight_type']}",
                            r["x86_saturating_pairs"], r["neon_wrapping_pairs"], "ok" if r["int32_ok"] else "OVERFLOW",
                            ", ".join(r["tiers"])] for r in risky])
        lines.append("")
    return lines


def _remedy_lines(rem: list[dict]) -> list[str]:
    """The remedy matrix."""
    return md_section("Remedy matrix",
                      "Decision cost: flips against fp32 on the same host (sum over hosts / worst host).",
                      ["remedy", "hosts", "classes", "one class", "flips vs fp32", "classes by host", "note"],
                      [[r["remedy"], ", ".join(r["hosts"]), r["classes"],
                        None if r["one_class"] is None else ("**yes**" if r["one_class"] else "no"),
                        None if r["flips_total"] is None else f"{r['flips_total']}/{r['flips_max']}",
                        " ".join(f"{h}={c}" for h, c in json.loads(r["class_map"]).items()) if r["class_map"] else None,
                        r["note"]] for r in rem])


def _noise_lines(noise: list[dict]) -> list[str]:
    """Noise floors per host and factor."""
    return md_section("Noise floors per host",
                      "One factor at a time; repeated runs of one session must be bit-identical (else a harness fault).",
                      ["host", "variant", "factor", "a", "b", "fixtures", "same bytes", "differ", "flips", "note"],
                      [[r["host"], r["variant"], r["factor"], r["setting_a"], r["setting_b"], r["fixtures"],
                        None if r["same_bytes"] is None else ("yes" if r["same_bytes"] else "**no**"),
                        r["differing_fixtures"], r["flips"], r["note"]] for r in noise])


def _latency_lines(lat: list[dict]) -> list[str]:
    """Latency and memory per host and variant."""
    return md_section("Latency and memory (local and ssh hosts only)", None,
                      ["host", "variant", "median ms", "spread ms", "peak RSS MiB", "speed-up vs fp32", "sign"],
                      [[r["host"], r["variant"], num(r["median_ms"], ".4g", None),
                        num(r["spread_ms"], ".4g", None), num(r["peak_rss_mb"], ".4g", None),
                        None if r["speedup_vs_fp32"] is None else f"{r['speedup_vs_fp32']:.2f}x", r["sign"] or None]
                       for r in lat])


#: the explain section's parts in order: (table, its lines), each shown when its table has rows
_PARTS = (("localize", _localize_lines), ("evidence", _evidence_lines), ("lint", _lint_lines),
          ("remedies", _remedy_lines), ("noise", _noise_lines), ("latency", _latency_lines))


def update_report(results_dir, tables_root) -> Path:
    """Re-render the explain section from the tables under `tables_root` and reassemble `results_dir`/report.md."""
    document.write_section(SECTION, render(tables_root), results_dir)
    return document.assemble(results_dir)
