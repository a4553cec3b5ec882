#!/bin/sh
# The check of pip installs (README's Install), offline with Debian's build
# tools: a virtual environment, `pip install --no-build-isolation` of the
# checkout (meson-python builds libdormant into the package), then, outside
# the checkout and without DORMANT_LIB or PYTHONPATH, import dormant (no torch)
# and check the version everywhere and that the bundled library works.
#   pip-install.sh SOURCE_ROOT MESON_PROJECT_VERSION
set -eu
src=$1
want=$2
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
unset DORMANT_LIB PYTHONPATH DORMANT_PRELOAD_LIB
/usr/bin/python3 -m venv --system-site-packages "$tmp/v"
if ! "$tmp/v/bin/pip" install --no-build-isolation --no-index --no-cache-dir "$src" \
	>"$tmp/pip.log" 2>&1; then
	cat "$tmp/pip.log"
	echo "pip install failed" >&2
	exit 1
fi
grep -q "filename=dormant-$want-" "$tmp/pip.log" ||
	{ cat "$tmp/pip.log"; echo "no wheel dormant-$want-*.whl built" >&2; exit 1; }
cd "$tmp"
"$tmp/v/bin/python" - "$want" "$tmp/v" <<'PY'
import os, sys
want, venv = sys.argv[1], os.path.realpath(sys.argv[2])
import dormant
assert "torch" not in sys.modules, "importing dormant imported torch"
here = os.path.realpath(os.path.dirname(dormant.__file__))
assert here.startswith(venv + os.sep), f"dormant imported from {here}, not the venv"
assert dormant.__version__ == want, f"dormant.__version__ {dormant.__version__!r} != {want!r}"
lib = dormant.library_path()
assert os.path.dirname(os.path.realpath(lib)) == here, f"libdormant loaded from {lib}"
c = dormant.Manager(backend="host")._lib.dormant_version().decode()
assert c == want, f"dormant_version() {c!r} != {want!r}"
shim = dormant.preload.library_path()
assert os.path.dirname(shim) == here, f"libdormant-preload.so at {shim}"
m = dormant.Manager(backend="host")
assert m.stats()["backend"] == "host"
print(f"dormant {dormant.__version__} from {here}: ok")
PY
# the shim loads on its own from the package (its RUNPATH finds libdormant.so)
shim=$("$tmp/v/bin/python" -c 'import dormant; print(dormant.preload.library_path())')
LD_PRELOAD="$shim" "$tmp/v/bin/python" -c '
import os, dormant
from dormant import _library
lib = _library.preloaded_path()
assert lib, "libdormant-preload.so did not load"
assert os.path.dirname(lib) == os.path.dirname(os.path.realpath(dormant.__file__)), lib
' 2>&1 || { echo "LD_PRELOAD=$shim failed" >&2; exit 1; }
echo "pip install: ok"
