#!/usr/bin/env bash
# The wheels that carry DeepSpeed 0.19.8 to the GPU machine (Python 3.12, no index there) for
# validation/gpu-deepspeed.yaml, into .whl/ at the repo's root (git-excluded here). Needs pip and an index here.
set -euo pipefail
cd "$(dirname "$0")/.."
grep -qx '/.whl/' .git/info/exclude 2>/dev/null || echo /.whl/ >> .git/info/exclude
mkdir -p .whl
DS_BUILD_OPS=0 python3 -m pip wheel -q --no-deps -w .whl deepspeed==0.19.8
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d .whl \
  hjson==3.1.0 py-cpuinfo==9.0.0 einops==0.8.2 msgpack==1.2.4 psutil==7.2.2 ninja==1.13.2 pydantic==2.14.4 \
  pydantic-core==2.50.5 annotated-types==0.8.0 typing-inspection==0.4.5 typing-extensions==4.16.0
ls -1 .whl
