#!/usr/bin/env bash
# Makes the example servers runnable: the Python virtualenv
# (examples/servers/.venv, python/requirements.txt), the Node.js modules
# (npm ci in node/) and the C++ server (make in cpp/). As root it first
# installs the Debian packages that are missing. Safe to run again: a step
# whose inputs have not changed is skipped.
#
#   examples/servers/setup.sh            # all three
#   examples/servers/setup.sh python cpp # some of them
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)

impls=("$@")
[ "${#impls[@]}" -gt 0 ] || impls=(python node cpp)
want() { local i; for i in "${impls[@]}"; do [ "$i" = "$1" ] && return 0; done; return 1; }
for i in "${impls[@]}"; do
  case "$i" in
    python | node | cpp) ;;
    *) echo "setup.sh: unknown implementation '$i' (python, node or cpp)" >&2; exit 2 ;;
  esac
done

step_start=0
step() { step_start=$(date +%s%N); printf '== %s\n' "$*"; }
done_step() {
  local ms=$((($(date +%s%N) - step_start) / 1000000))
  printf '   %s (%d.%01d s)\n' "$1" $((ms / 1000)) $((ms % 1000 / 100))
}

# Debian packages, by what each implementation needs. Node.js and npm only
# when the commands are absent (a Node.js from elsewhere is fine, and its
# own npm must not be replaced by Debian's).
packages=()
if want python; then packages+=(python3-venv); fi
if want node; then
  command -v node >/dev/null || packages+=(nodejs)
  command -v npm >/dev/null || packages+=(npm)
fi
if want cpp; then packages+=(libgrpc++-dev protobuf-compiler-grpc protobuf-compiler libprotobuf-dev pkg-config g++ make); fi
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ "${#missing[@]}" -gt 0 ]; then
  if [ "$(id -u)" = 0 ]; then
    step "apt-get install ${missing[*]}"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}"
    done_step "installed"
  else
    # Not root: the tools may come from elsewhere; a step that lacks one fails.
    echo "setup.sh: warning: Debian packages not installed: ${missing[*]}" >&2
    echo "  (run this script as root, or: sudo apt-get install ${missing[*]})" >&2
  fi
fi

if want python; then
  step "python: virtualenv $here/.venv"
  venv="$here/.venv"
  if [ ! -x "$venv/bin/python" ]; then
    python3 -m venv "$venv"
  fi
  # The requirements last installed are kept beside the venv: unchanged, no pip.
  if cmp -s "$here/python/requirements.txt" "$venv/.installed-requirements.txt"; then
    done_step "requirements already installed"
  else
    "$venv/bin/python" -m pip install --quiet --disable-pip-version-check --require-virtualenv -r "$here/python/requirements.txt"
    cp "$here/python/requirements.txt" "$venv/.installed-requirements.txt"
    done_step "requirements installed"
  fi
fi

if want node; then
  step "node: npm ci in $here/node"
  # npm ci empties node_modules first: run only when the lock file changed.
  if cmp -s "$here/node/package-lock.json" "$here/node/node_modules/.installed-package-lock.json"; then
    done_step "modules already installed"
  else
    (cd "$here/node" && npm ci --no-audit --no-fund --loglevel=error)
    cp "$here/node/package-lock.json" "$here/node/node_modules/.installed-package-lock.json"
    done_step "modules installed"
  fi
fi

if want cpp; then
  step "cpp: make in $here/cpp"
  make -C "$here/cpp" --no-print-directory
  done_step "built $here/cpp/build/echo-server"
fi

which=--all
[ "${#impls[@]}" -eq 3 ] || which=$(printf -- '--impl %s ' "${impls[@]}")
echo "setup.sh: ready (${impls[*]}); check with: $here/.venv/bin/python $here/check.py ${which% }"
