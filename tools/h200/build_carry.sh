#!/usr/bin/env bash
# Build .cache/h200/carry/ for the lent H200 (device tool, <= 64 MiB a call): SGLang 0.5.23's closure as
# cp312 wheels unpacked and trimmed into one site.tar.xz, plus sgl_kernel's real scalar_type module.
# Idempotent: nothing is rebuilt while the tarball is newer than this script and requirements.txt.
set -euo pipefail
cd "$(dirname "$0")/../.."
HERE=tools/h200 CACHE=.cache/h200 OUT=.cache/h200/carry
PIP=(pip --disable-pip-version-check -q)
PLATFORM=(--only-binary=:all: --python-version 3.12 --implementation cp --platform manylinux_2_34_x86_64
          --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_26_x86_64
          --platform manylinux_2_24_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64
          --platform manylinux1_x86_64 --platform manylinux_2_5_x86_64)
if [ -f "$OUT/site.tar.xz" ] && [ "$OUT/site.tar.xz" -nt "$HERE/requirements.txt" ] && [ "$OUT/site.tar.xz" -nt "$0" ]; then
  echo "carry is up to date: $(du -h "$OUT/site.tar.xz" | cut -f1) $OUT/site.tar.xz"; exit 0
fi
mkdir -p "$CACHE/wheels" "$OUT"
"${PIP[@]}" download --no-deps "${PLATFORM[@]}" -d "$CACHE/wheels" -r "$HERE/requirements.txt" 2>&1 | grep -v "^WARNING: Location" || true
rm -rf "$CACHE/site" && mkdir -p "$CACHE/site"
"${PIP[@]}" install --no-deps --no-index --find-links "$CACHE/wheels" "${PLATFORM[@]}" --target "$CACHE/site" \
  -r "$HERE/requirements.txt" 2>&1 | grep -v "^WARNING: Location" || true
test -f "$CACHE/site/sglang/version.py" || { echo "build_carry: sglang did not unpack" >&2; exit 1; }
# Not needed to serve a text model; the Rust extensions are the bulk of the wheel.
rm -rf "$CACHE/site/sglang/multimodal_gen" "$CACHE/site/sglang/test" "$CACHE/site/bin"
find "$CACHE/site/sglang" -maxdepth 1 \( -name "_bench*" -o -name "_grpc*" -o -name "_multimodal*" \) -exec rm -rf {} +
find "$CACHE/site" -name __pycache__ -type d -prune -exec rm -rf {} +
# From the real sglang-kernel wheel: its scalar_type module (plain Python that SGLang's quantization
# utils import at module level) and the names each of its modules exports, for the stand-in.
"${PIP[@]}" download --no-deps "${PLATFORM[@]}" -d "$CACHE/wheels" sglang-kernel==0.4.10 2>&1 | grep -v "^WARNING: Location" || true
WHEEL=$(ls "$CACHE"/wheels/sglang_kernel-0.4.10-*.whl)
python3 -c "import zipfile,sys; open(sys.argv[2],'wb').write(zipfile.ZipFile(sys.argv[1]).read('sgl_kernel/scalar_type.py'))" \
  "$WHEEL" "$OUT/scalar_type.py"
python3 "$HERE/sgl_kernel_names.py" "$WHEEL" "$OUT/sgl_kernel_names.json"
tar -C "$CACHE/site" -cf - . | xz -T1 -6 > "$OUT/site.tar.xz.tmp" && mv "$OUT/site.tar.xz.tmp" "$OUT/site.tar.xz"
echo "carry: $(du -h "$OUT/site.tar.xz" | cut -f1) $OUT/site.tar.xz, scalar_type.py, sgl_kernel_names.json"
