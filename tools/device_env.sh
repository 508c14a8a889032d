# The Python setup every script run on the GPU device machine shares. Source it from the repository
# root, and stop if it fails:
#
#   . tools/device_env.sh || exit 1
#
# The device machine has Python 3.12 with torch, triton, httpx and click, but not kb or its other
# dependencies, and it has no network. This script does three things:
#
# 1. kb's dependencies: the wheels in .whl/ (carried with the working tree) go into /tmp/site. Make them
#    beforehand on a machine with network. pip can fetch them for the device's Python:
#      pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
#        --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d .whl \
#        pydantic pydantic-core annotated-types typing-inspection orjson pysqlite3 click-default-group
#    MEASURE_DEVICE=cpu (tools/h200_measure.sh's dry run, from a venv that has them) skips this step.
# 2. kb itself goes into /tmp/kb, installed from a clean copy of this checkout. A stale build/ could
#    otherwise leak old modules into the install. A source checkout on PYTHONPATH is not enough:
#    store/ and migrations/ install as kernelbrain.store and kernelbrain.store.migrations (pyproject's
#    package-dir). If the device's setuptools cannot build it, a wheel carried in .whl/ is used
#    instead. Build that wheel here with `.venv/bin/python -m pip wheel --no-deps -w .whl .`.
# 3. PYTHONPATH=/tmp/kb:/tmp/site:$PWD, with the installed kb first and the checkout last (for
#    `tools.*`). PYTHONSAFEPATH=1 stops `python -m kernelbrain` (kb's workers, the search's runs) and
#    `python tools/x.py` from putting the checkout, or tools/, ahead of it.

_kb_target=/tmp/kb
_kb_site=/tmp/site
_kb_deps=0
if [ "${MEASURE_DEVICE:-cuda}" = cuda ]; then
  _kb_wheels=()
  for _kb_w in .whl/*.whl; do
    case $_kb_w in .whl/kernelbrain-*) ;; *) [ -f "$_kb_w" ] && _kb_wheels+=("$_kb_w") ;; esac
  done
  rm -rf "$_kb_site"  # a warm machine keeps /tmp: pip --target would not replace what is there
  if [ ${#_kb_wheels[@]} -gt 0 ]; then
    python3 -m pip install -q --no-index --no-deps --no-compile --target "$_kb_site" "${_kb_wheels[@]}" ||
      { echo "device_env: installing .whl/ into $_kb_site failed" >&2; return 1; }
  fi
  _kb_deps=1
fi

rm -rf "$_kb_target"
_kb_src=$(mktemp -d)
tar -cf - --exclude=./.git --exclude=./.venv --exclude=./.whl --exclude=./build --exclude='*.egg-info' \
  --exclude=./benchmarks/results --exclude=./tests/fixtures . | tar -xf - -C "$_kb_src"
if ! python3 -m pip install -q --no-deps --no-build-isolation --no-index --target "$_kb_target" "$_kb_src"; then
  _kb_wheel=$(ls .whl/kernelbrain-*.whl 2>/dev/null | tail -n 1)
  if [ -z "$_kb_wheel" ]; then
    echo "device_env: pip could not install kb from the checkout, and .whl/ holds no kernelbrain wheel" \
      "(build one with \`.venv/bin/python -m pip wheel --no-deps -w .whl .\`)" >&2
    rm -rf "$_kb_src"
    return 1
  fi
  echo "device_env: installing $_kb_wheel instead" >&2
  rm -rf "$_kb_target"
  python3 -m pip install -q --no-index --no-deps --no-compile --target "$_kb_target" "$_kb_wheel" ||
    { rm -rf "$_kb_src"; return 1; }
fi
rm -rf "$_kb_src"

if [ "$_kb_deps" = 1 ]; then
  export PYTHONPATH=$_kb_target:$_kb_site:$PWD
else
  export PYTHONPATH=$_kb_target:$PWD
fi
export PYTHONSAFEPATH=1 PYTHONUNBUFFERED=1
# the installed kb, with its migrations, must be what an import finds
(cd / && python3 -c "import kernelbrain.store.migrate as m; assert m.discover()") ||
  { echo "device_env: kb installed in $_kb_target does not import" >&2; return 1; }
unset _kb_target _kb_site _kb_deps _kb_wheels _kb_w _kb_src _kb_wheel
