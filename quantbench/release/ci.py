"""A CI recipe for a release check on real ARM and x86 runners: `quantbench ci` writes a GitHub Actions workflow
and a .gitlab-ci.yml (parameters in, YAML text out; same parameters, same bytes).

The jobs:

- `prepare`: installs quantbench, calibrates (or takes the committed variants) and passes the variants, the labels
  and the images on as one artifact (`qb-inputs/`), so every later job runs the same bytes;
- one job per (runner, host, shard): each native runner label (`ubuntu-24.04`, `ubuntu-24.04-arm`: real silicon)
  runs the local host, exported under the label's host name (`--as`), then every masked x86 tier of `tiers` its
  CPU shows (decided on the runner by `quantbench hosts shown`: the runner's CPU is unknown here), each exported as
  the host NAME-TIER; each emulated host runs on any runner, its emulated root cached (actions/cache, keyed on what
  `quantbench hosts setup` builds); each job uploads its exports;
- `merge`: downloads every export, writes a hosts file with one imported host per host (its shards as a list of
  files) and per tier a runner showed (found at run time), runs `quantbench equiv` with the user's gate over them
  and the tiers no runner showed (predicted where the merge runner cannot show them either) and builds the release
  archive.

Every job installs quantbench from the checkout (the commit the workflow runs at) with onnxruntime pinned to the
version given (the local one by default), so the x86 and ARM hosts differ only in their CPUs.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

from quantbench.analysis.gates import parse_budget, parse_gates
from quantbench.errors import ParameterError, UserError, flag_mark
from quantbench.fsutil import atomic_write_text, check_writable_for
from quantbench.hosts.cpuprofiles import PROFILES
from quantbench.hosts.emulated import PRESETS

#: GitHub's hosted runner labels that are real silicon, and the host name each exports
GITHUB_RUNNERS = {"ubuntu-24.04": "gh-x86", "ubuntu-24.04-arm": "gh-arm64"}
#: GitLab's hosted runner tags of the same kind
GITLAB_RUNNERS = {"saas-linux-small-amd64": "gl-x86", "saas-linux-small-arm64": "gl-arm64"}
INPUTS = "qb-inputs"
SHARDS = "qb-shards"
HOME = ".qb-home"
_NAME = re.compile(r"^[a-z0-9][a-z0-9-]*$")
EXPRESSION = "${{"   # what opens a GitHub Actions expression
MAX_JOBS = 256       # shard jobs in one workflow (GitHub's bound on a matrix's jobs)


@dataclass
class CIParams:
    """What the workflow runs. `inputs`: labels and images paths in the checkout (None: the bundled demo corpus);
    `variants`: a committed variants folder, or `calibrate`: the arguments of `quantbench calibrate`
    (neither: the bundled demo models); `extra`: further fixture flags (e.g. ["--limit", "50"])."""

    onnxruntime: str
    python: str = "3.11"
    emulated: list = field(default_factory=lambda: ["pi"])
    shards: int = 3
    runners: dict = field(default_factory=lambda: dict(GITHUB_RUNNERS))
    native_shards: int = 1
    native_runs: int = 1   # whole runs per native label: a label whose runners differ shows up as one host per CPU
    variants: str | None = None
    calibrate: list | None = None
    labels: str | None = None
    images: str | None = None
    extra: list = field(default_factory=list)
    gate: str | None = None
    budget: int | str | None = None   # the merge job's decision budget: flips, or a share of the served ("1%")
    install: str = ".[plots]"
    emulated_runner: str = "ubuntu-24.04"
    limit: int | None = None   # evaluate on this many images (balanced over strata)
    split: str | None = None   # the labels split to evaluate on
    tiers: list = field(default_factory=lambda: list(PROFILES))   # masked x86 tiers each native job runs if shown

    def check(self) -> None:
        for name in ("shards", "native_shards", "native_runs") + (("limit",) if self.limit is not None else ()):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ParameterError(name, "must be at least 1", v)
        self._check_literal()
        self._check_paths()
        if self.gate is not None and not parse_gates(self.gate):   # an unknown gate fails here, not in the merge job
            raise ParameterError("gate", "names no gate: the merge job's equiv would gate nothing and always pass "
                                         "(name one, e.g. decision, or leave it out)", self.gate)
        if self.budget is not None:
            parse_budget(self.budget)   # and so does a budget that is neither a count nor a share
        if not self.runners:
            raise ParameterError("runners", "names no native runner: the workflow would run no real CPU "
                                            "(give LABEL=NAME, e.g. ubuntu-24.04=gh-x86)", "")
        unknown = [h for h in self.emulated if h not in PRESETS]
        if unknown:
            raise ParameterError("emulated", f"not emulated presets ({', '.join(PRESETS)})", ",".join(unknown))
        unknown = [t for t in self.tiers if t not in PROFILES]
        if unknown:
            raise ParameterError("tiers", f"not x86 tiers ({', '.join(PROFILES)})", ",".join(map(str, unknown)))
        names = list(self.runners.values()) + list(self.emulated) + [h for h, _ in tier_hosts(self)] + \
            [t for t in self.tiers if t not in self.emulated]   # NAME-TIER per runner; a tier nobody shows by name
        bad = [n for n in names if not _NAME.match(n)] or sorted({n for n in names if names.count(n) > 1})
        if bad or not names:
            raise ParameterError("runners", "host names (runners, emulated hosts, NAME-TIER of each tier) must be "
                                            "distinct, lower-case letters, digits and '-'", ",".join(bad or names))
        if self.native_runs > 1 and self.native_shards > 1:
            raise ParameterError("native_runs", "repeats whole runs; shard them or repeat them, not both",
                                 self.native_runs)
        if self.variants and self.calibrate:
            raise ParameterError("calibrate", "calibrates variants, and variants names committed ones: give one",
                                 " ".join(self.calibrate))
        if bool(self.labels) != bool(self.images):
            raise ParameterError("images", "labels and images go together", self.images or self.labels)
        n = len(self.runners) * max(self.native_runs, self.native_shards) + len(self.emulated) * self.shards
        if n > MAX_JOBS:
            worst = max(("shards", "native_shards", "native_runs"), key=lambda k: getattr(self, k))
            raise ParameterError(worst, f"makes {n} shard jobs; a workflow holds at most {MAX_JOBS}",
                                 getattr(self, worst))

    def _check_paths(self) -> None:
        """The prepare job copies these from the checkout into the artifact every job downloads: a path that leaves
        the checkout (absolute, '..', or a link out of this working folder) would ship whatever it names."""
        here = Path.cwd().resolve()
        for name in ("variants", "labels", "images"):
            v = getattr(self, name)
            if v is None:
                continue
            p = Path(str(v))
            if not str(v).strip() or p.is_absolute() or ".." in p.parts or not (here / p).resolve().is_relative_to(here):
                raise ParameterError(name, "must be a path inside the repository's checkout (relative, no '..', no "
                                           "link out of it): the prepare job copies it into the workflow's artifact", v)

    def _check_literal(self) -> None:
        """Every value is written literally: `${{` in one would be evaluated by GitHub Actions before the shell
        runs (in a `run:` script or `runs-on`), so it is refused, whatever the quoting."""
        values = [(k, getattr(self, k)) for k in ("onnxruntime", "python", "variants", "labels", "images", "gate",
                                                  "install", "emulated_runner", "split")]
        values += [("calibrate", " ".join(map(str, self.calibrate or []))), ("extra", " ".join(map(str, self.extra))),
                   ("emulated", ",".join(map(str, self.emulated))), ("tiers", ",".join(map(str, self.tiers))),
                   ("runners", ",".join(f"{k}={v}" for k, v in self.runners.items()))]
        for name, v in values:
            if v is not None and EXPRESSION in str(v):
                raise ParameterError(name, f"holds {EXPRESSION!r}: GitHub Actions would evaluate it before the "
                                           "shell runs (script injection); give a literal value", v)


def jobs(p: CIParams) -> list[dict]:
    """The shard jobs: [{id, runner, host (run here), name (exported as), k, n, emulated}] in a fixed order."""
    out = []
    for label, name in p.runners.items():
        if p.native_runs > 1:  # whole runs, each on whichever machine of the label the job gets
            out += [{"id": f"{name}-run{r}", "runner": label, "host": "local", "name": name, "k": None, "n": None,
                     "emulated": False} for r in range(1, p.native_runs + 1)]
            continue
        out += [{"id": f"{name}-{k}of{p.native_shards}", "runner": label, "host": "local", "name": name, "k": k,
                 "n": p.native_shards, "emulated": False} for k in range(1, p.native_shards + 1)]
    for host in p.emulated:
        out += [{"id": f"{host}-{k}of{p.shards}", "runner": p.emulated_runner, "host": host, "name": host, "k": k,
                 "n": p.shards, "emulated": True} for k in range(1, p.shards + 1)]
    return out


def tier_hosts(p: CIParams) -> list[tuple[str, str]]:
    """(host name, tier) of every tier a native runner may show: NAME-TIER, NAME the runner's host name."""
    return [(f"{name}-{tier}", tier) for name in p.runners.values() for tier in p.tiers]


def _has_inputs(p: CIParams) -> bool:
    return bool(p.variants or p.calibrate or p.labels)


def _input_args(p: CIParams) -> list[str]:
    """The variants and fixture flags every run and the equiv take (the prepared inputs, same bytes everywhere)."""
    args = []
    if p.variants or p.calibrate:
        args += ["--variants", f"{INPUTS}/variants"]
    if p.labels:
        args += ["--fixtures", f"{INPUTS}/labels.json", "--images", f"{INPUTS}/images"]
    args += ["--limit", str(p.limit)] if p.limit is not None else []
    args += ["--split", p.split] if p.split else []
    return args + [str(a) for a in p.extra]


def _sh(words) -> str:
    """Words as one shell command line (single-quoted where needed)."""
    return " ".join(w if re.match(r"^[A-Za-z0-9_./=:,@%+-]+$", w) else "'" + w.replace("'", "'\\''") + "'"
                    for w in map(str, words))


def _prepare_script(p: CIParams) -> str:
    lines = [f"mkdir -p {INPUTS}"]
    if p.calibrate:
        lines.append(_sh(["quantbench", "calibrate", *p.calibrate, "--out", f"{INPUTS}/variants"]))
    elif p.variants:
        lines.append(_sh(["cp", "-r", p.variants, f"{INPUTS}/variants"]))
    if p.labels:
        lines += [_sh(["cp", p.labels, f"{INPUTS}/labels.json"]), _sh(["cp", "-r", p.images, f"{INPUTS}/images"])]
    return "\n".join(lines) + "\n"


def shard_command(p: CIParams, job: dict) -> str:
    """The quantbench command of one shard job."""
    shard = ["--shard", f"{job['k']}/{job['n']}"] if job["k"] is not None else []
    words = ["quantbench", "run", "--hosts", job["host"], *shard, "--export", f"{SHARDS}/{job['id']}.qbr",
             *_input_args(p), "--no-progress"]
    if not job["emulated"]:
        words[-1:-1] = ["--as", job["name"]]
    return f"mkdir -p {SHARDS}\n" + _sh(words) + "\n"


def tier_script(p: CIParams, job: dict) -> str:
    """After a native job's own run: every tier of `tiers` this runner's CPU shows (`quantbench hosts shown`
    decides here; it says why of each other one), run masked and exported as NAME-TIER, in the job's shard."""
    shard = ["--shard", f"{job['k']}/{job['n']}"] if job["k"] is not None else []
    rest = _sh([*shard, *_input_args(p), "--no-progress"])
    return (f'tiers="$({_sh(["quantbench", "hosts", "shown", *p.tiers])})"\n'
            'for tier in $tiers; do\n'
            f'  quantbench run --hosts "$tier:masked" --export "{SHARDS}/{job["id"]}.$tier.qbr" '
            f'--as "{job["name"]}-$tier" {rest}\n'
            "done\n")


def hosts_file(p: CIParams) -> str:
    """The merge job's hosts file: one imported host per exported host, its shards as a list of files; each tier
    masked (never its qemu preset: a tier no runner showed is predicted unless the merge runner shows it)."""
    by_name: dict = {}
    for j in jobs(p):
        by_name.setdefault(j["name"], []).append(f"{j['id']}.qbr")
    lines = []
    for name, files in by_name.items():
        over = ", override = true" if name in PRESETS or name in ("x86", "local") else ""
        lines.append(f'{name} = {{ kind = "imported", file = [{", ".join(json.dumps(f) for f in files)}]{over} }}')
    lines += [f'{t} = {{ kind = "masked", profile = "{t}", mechanism = "masked", override = true }}'
              for t in p.tiers if t not in p.emulated]
    return "\n".join(lines) + "\n"


#: the merge job's shell function adding a tier a runner showed to the hosts file and to $hosts
TIER_HOST = (
    'tier_host() {{  # NAME TIER JOB...: the imported host NAME-TIER of the exports the jobs made, if any\n'
    '  name=$1 tier=$2 files=""\n'
    '  shift 2\n'
    '  for job in "$@"; do\n'
    '    if [ -f "{shards}/$job.$tier.qbr" ]; then files="$files\\"$job.$tier.qbr\\", "; fi\n'
    '  done\n'
    '  [ -n "$files" ] || return 1\n'
    '  echo "$name-$tier = {{ kind = \\"imported\\", file = [${{files%, }}] }}" >> {shards}/hosts.toml\n'
    '  hosts="$hosts,$name-$tier"\n'
    '}}\n')


def _merge_tiers(p: CIParams) -> list[str]:
    """Shell lines adding each tier a runner showed as a host of its own (NAME-TIER, in the order of tier_hosts; its
    files split by CPU model as any imported host's are), then each tier no runner showed by its own name (equiv
    predicts it); a tier an emulated job runs under qemu is shown by that host."""
    if not p.tiers:
        return []
    by_name: dict = {}
    for j in jobs(p):
        if not j["emulated"]:
            by_name.setdefault(j["name"], []).append(j["id"])
    lines = TIER_HOST.format(shards=SHARDS).splitlines() + ['shown=" "']
    for name, ids in by_name.items():
        lines += [f"for tier in {_sh(p.tiers)}; do",
                  f'  if tier_host {name} "$tier" {_sh(ids)}; then shown="$shown$tier "; fi', "done"]
    rest = [t for t in p.tiers if t not in p.emulated]
    return lines + ([f"for tier in {_sh(rest)}; do",
                     '  case "$shown" in *" $tier "*) ;; *)',
                     '    echo "$tier: shown by no runner: equiv predicts it (or measures it, where this runner shows it)"',
                     '    hosts="$hosts,$tier" ;;', "  esac", "done"] if rest else [])


def merge_script(p: CIParams) -> str:
    """Write the hosts file (the tiers the runners showed added at run time), run equiv over every host with the
    gate, build the release archive."""
    names = list(dict.fromkeys(j["name"] for j in jobs(p)))
    equiv = ["quantbench", "equiv", "--hosts", "HOSTS", "--hosts-file", f"{SHARDS}/hosts.toml",
             *_input_args(p), "--results", "results", "--no-progress"]
    if p.gate:
        equiv += ["--gate", p.gate]
    if p.budget is not None:
        equiv += ["--budget", str(parse_budget(p.budget).value())]
    lines = [f"cat > {SHARDS}/hosts.toml <<'EOF'", *hosts_file(p).splitlines(), "EOF", f"hosts={_sh([','.join(names)])}",
             *_merge_tiers(p), _sh(equiv).replace(" HOSTS ", ' "$hosts" ', 1)]
    if p.variants or p.calibrate:
        lines.append('quantbench release --tag "ci-${GITHUB_RUN_ID:-${CI_PIPELINE_ID:-local}}" '
                     f"--variants {INPUTS}/variants --results results --archive")
    return "\n".join(lines) + "\n"


def cache_key(p: CIParams, host: str, arch: str) -> str:
    """What `quantbench hosts setup HOST` builds depends on: the preset, the runner's architecture, the
    onnxruntime version (its aarch64 wheels), the guest Python, and quantbench's setup code (hashFiles)."""
    return (f"quantbench-hosts-{host}-{arch}-ort{p.onnxruntime}-py{p.python}-"
            "${{ hashFiles('quantbench/hosts/setup/*.py', 'quantbench/hosts/emulated.py') }}")


# --------------------------------------------------------------------------- GitHub Actions


def _install_steps(p: CIParams) -> list[dict]:
    return [
        {"uses": "actions/checkout@v4"},
        {"uses": "actions/setup-python@v5", "with": {"python-version": p.python}},
        {"name": "install quantbench (this commit) and onnxruntime " + p.onnxruntime,
         "run": _sh(["python", "-m", "pip", "install", p.install, f"onnxruntime=={p.onnxruntime}"]) + "\n"},
    ]


def _github_shard_job(p: CIParams, job: dict) -> dict:
    steps = _install_steps(p)
    if _has_inputs(p):
        steps.append({"uses": "actions/download-artifact@v4", "with": {"name": "qb-inputs", "path": INPUTS}})
    if job["emulated"]:
        steps += [
            {"uses": "actions/cache@v4",
             "with": {"path": HOME, "key": cache_key(p, job["host"], "${{ runner.arch }}")}},
            {"name": f"set up emulated host {job['host']}", "env": {"QUANTBENCH_DEBIAN_MIRROR": MIRROR_VAR},
             "run": SETUP_SCRIPT.format(host=job["host"], home=HOME)},
        ]
    steps.append({"name": f"run {job['host']} {'shard ' + str(job['k']) + '/' + str(job['n']) if job['k'] else 'whole'}"
                          f" as {job['name']}", "run": shard_command(p, job)})
    if not job["emulated"] and p.tiers:
        steps.append({"name": f"run the x86 tiers this runner shows as {job['name']}-TIER",
                      "run": tier_script(p, job)})
    steps.append({"uses": "actions/upload-artifact@v4", "with": {"name": f"qb-shard-{job['id']}",
                                                                "path": _exports(p, job)}})
    return {"needs": ["prepare"], "runs-on": job["runner"], "steps": steps}


def _exports(p: CIParams, job: dict) -> str:
    """The files a shard job exports: its run, and on a native job every tier it showed (JOB.TIER.qbr)."""
    return f"{SHARDS}/{job['id']}.{'*' if not job['emulated'] and p.tiers else 'qbr'}"


def github_workflow(p: CIParams) -> str:
    """The GitHub Actions workflow (YAML text) of the parameters."""
    p.check()
    prepare = _install_steps(p)
    if _has_inputs(p):
        prepare += [{"name": "calibrate" if p.calibrate else "collect the variants and fixtures",
                     "run": _prepare_script(p)},
                    {"uses": "actions/upload-artifact@v4", "with": {"name": "qb-inputs", "path": INPUTS}}]
    else:
        prepare.append({"name": "check the hosts", "run": "quantbench hosts list\n"})
    all_jobs = {"prepare": {"runs-on": "ubuntu-24.04", "steps": prepare}}
    for j in jobs(p):
        all_jobs[j["id"]] = _github_shard_job(p, j)
    merge = _install_steps(p)
    if _has_inputs(p):
        merge.append({"uses": "actions/download-artifact@v4", "with": {"name": "qb-inputs", "path": INPUTS}})
    merge += [
        {"uses": "actions/download-artifact@v4",
         "with": {"pattern": "qb-shard-*", "path": SHARDS, "merge-multiple": True}},
        {"name": "merge the shards, equiv, release", "run": merge_script(p)},
        {"if": "always()", "uses": "actions/upload-artifact@v4", "with": {"name": "quantbench-results",
                                                                          "path": "results"}},
    ]
    all_jobs["merge"] = {"needs": [j["id"] for j in jobs(p)], "runs-on": "ubuntu-24.04", "steps": merge}
    doc = {"name": "quantbench", "on": {"workflow_dispatch": {}, "push": {"branches": ["main"]}},
           "permissions": {"contents": "read"},
           "env": {"QUANTBENCH_HOME": "${{ github.workspace }}/" + HOME}, "jobs": all_jobs}
    return HEADER + to_yaml(doc)


#: a Debian mirror for `hosts setup` on Ubuntu runners (their apt sources name no Debian archive): a repository
#: variable the user sets (Settings > Variables), never a host written here
MIRROR_VAR = "${{ vars.QUANTBENCH_DEBIAN_MIRROR }}"
SETUP_SCRIPT = ("sudo apt-get update -qq\n"
                "sudo apt-get install -y -qq debootstrap debian-archive-keyring\n"
                'sudo -E env "PATH=$PATH" quantbench hosts setup {host}\n'
                'sudo chown -R "$(id -u)" {home}\n')

HEADER = ("# Written by `quantbench ci`: a release check on real ARM and x86 runners and emulated hosts.\n"
          "# Copy it to .github/workflows/; docs/hosts.md (Scale-out: shards and CI) explains the jobs.\n")


# --------------------------------------------------------------------------- GitLab CI


def gitlab_ci(p: CIParams, runners: dict | None = None) -> str:
    """The .gitlab-ci.yml (YAML text): the same jobs on GitLab's runners (`runners`: tag -> host name)."""
    p.check()
    gl = CIParams(**{**p.__dict__, "runners": dict(runners or GITLAB_RUNNERS)})
    gl.check()
    install = [_sh(["python", "-m", "pip", "install", gl.install, f"onnxruntime=={gl.onnxruntime}"])]
    doc: dict = {"stages": ["prepare", "shards", "merge"], "default": {"image": f"python:{gl.python}"},
                 "variables": {"QUANTBENCH_HOME": "$CI_PROJECT_DIR/" + HOME}}
    prep = {"stage": "prepare", "script": install + (_prepare_script(gl).splitlines() if _has_inputs(gl)
                                                     else ["quantbench hosts list"])}
    if _has_inputs(gl):
        prep["artifacts"] = {"paths": [INPUTS]}
    doc["prepare"] = prep
    for j in jobs(gl):
        job = {"stage": "shards", "needs": ["prepare"], "script": install + shard_command(gl, j).splitlines(),
               "artifacts": {"paths": [_exports(gl, j)]}}
        if j["emulated"]:
            job["cache"] = {"key": f"quantbench-hosts-{j['host']}-ort{gl.onnxruntime}-py{gl.python}",
                            "paths": [HOME]}
            job["script"] = install + ["apt-get update -qq", "apt-get install -y -qq debootstrap",
                                       f"quantbench hosts setup {j['host']}"] + \
                shard_command(gl, j).splitlines()
        else:
            job["tags"] = [j["runner"]]
            job["script"] += [tier_script(gl, j)] if gl.tiers else []
        doc[j["id"]] = job
    # no `needs`: the merge stage runs after every shard job and takes every earlier job's artifacts (a job may
    # name at most 50 needs on GitLab, and a workflow may hold up to MAX_JOBS shard jobs)
    doc["merge"] = {"stage": "merge", "script": install + [merge_script(gl)],
                    "artifacts": {"when": "always", "paths": ["results"]}}
    return HEADER.replace(".github/workflows/", "the repository root as .gitlab-ci.yml") + to_yaml(doc)


# --------------------------------------------------------------------------- YAML text


def _scalar(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    return json.dumps(str(v))  # a JSON string is a YAML double-quoted scalar


def to_yaml(obj, indent: int = 0) -> str:
    """Block YAML of dicts, lists, strings, ints and bools: strings double-quoted, multi-line strings as literal
    blocks (`|`), keys plain (they are identifiers here), empty dicts `{}`."""
    pad = "  " * indent
    out = []
    items = obj.items() if isinstance(obj, dict) else [(None, v) for v in obj]
    for key, v in items:
        head = f"{pad}{key}:" if key is not None else f"{pad}-"
        if isinstance(v, (dict, list)) and v:
            if key is None:  # a list item: its first key on the dash's line
                text = to_yaml(v, indent + 1)
                out.append(f"{pad}- {text[len(pad) + 2:]}" if isinstance(v, dict) else f"{head}\n{text}")
            else:
                out.append(f"{head}\n{to_yaml(v, indent + 1)}")
        elif isinstance(v, (dict, list)):
            out.append(f"{head} {'{}' if isinstance(v, dict) else '[]'}\n")
        elif isinstance(v, str) and "\n" in v.rstrip("\n"):
            body = "".join(f"{pad}  {ln}\n" if ln else "\n" for ln in v.rstrip("\n").split("\n"))
            out.append(f"{head} |\n{body}")
        else:
            out.append(f"{head} {_scalar(v)}\n")
    return "".join(out)


# --------------------------------------------------------------------------- files

GITHUB_FILE = "quantbench.yml"
GITLAB_FILE = ".gitlab-ci.yml"


def write_ci(p: CIParams, out_dir, force: bool = False) -> list:
    """Write the GitHub workflow and the .gitlab-ci.yml into `out_dir`; an existing file is an error (nothing
    written) unless `force`. Returns the paths written."""
    texts = {GITHUB_FILE: github_workflow(p), GITLAB_FILE: gitlab_ci(p)}
    if not str(out_dir).strip():
        raise ParameterError("out", "is empty: name the folder the workflow files go to; nothing was written", out_dir)
    out = Path(out_dir)
    if out.is_symlink() and not out.exists():
        raise ParameterError("out", "is a symbolic link to nothing; nothing was written (remove it or choose another "
                                    "folder)", str(out))
    if out.exists() and not out.is_dir():
        raise ParameterError("out", "is a file, not a folder; nothing was written", str(out))
    folders = [out / n for n in texts if (out / n).is_dir()]
    if folders:
        raise UserError(f"{folders[0]}: a folder, not a file; nothing was written (choose another folder)")
    if not force:   # lexists: a dangling link is a file there too, replaced only when asked
        there = [out / n for n in texts if os.path.lexists(out / n)]
        if there:
            raise UserError(f"{there[0]}: exists; nothing was written (choose another folder, or overwrite it with "
                            f"{flag_mark('force')})")
    check_writable_for(out / GITHUB_FILE, "nothing was written")   # a read-only folder: one line, nothing made
    out.mkdir(parents=True, exist_ok=True)
    return [atomic_write_text(out / name, text) for name, text in texts.items()]
