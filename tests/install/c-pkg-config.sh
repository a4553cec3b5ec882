#!/bin/sh
# A C user's first build: `meson install --destdir` of this build folder, then
# the README's compile line for examples/hello.c with pkg-config pointed at
# that tree, and the program run on the host backend. Every installed header
# must also compile on its own. The installed library's soname carries the ABI
# major (abi_major in meson.build), and the program needs it by that name.
#   c-pkg-config.sh BUILD_DIR SOURCE_ROOT LIBDIR MESON_PROJECT_VERSION ABI_MAJOR
set -eu
build=$1
src=$2
libdir=$3
want=$4
abi=$5
cc=${CC:-cc}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
root=$tmp/root
meson install -C "$build" --no-rebuild --quiet --destdir "$root" >"$tmp/install.log" 2>&1 ||
	{ cat "$tmp/install.log"; echo "meson install failed" >&2; exit 1; }
pc=$root$libdir/pkgconfig/dormant.pc
[ -f "$pc" ] || { echo "no dormant.pc at $pc" >&2; exit 1; }
export PKG_CONFIG_PATH="$root$libdir/pkgconfig" PKG_CONFIG_SYSROOT_DIR="$root"
export PKG_CONFIG_LIBDIR=/nonexistent # this tree's .pc files only
[ "$(pkg-config --modversion dormant)" = "$want" ] ||
	{ echo "pkg-config --modversion dormant: $(pkg-config --modversion dormant), not $want" >&2; exit 1; }
flags=$(pkg-config --cflags --libs dormant)
echo "pkg-config --cflags --libs dormant: $flags"
for h in dormant.h dormant-json.h dormant-server.h dormant-preload.h; do
	printf '#include <%s>\nint main(void) { return 0; }\n' "$h" >"$tmp/h.c"
	# shellcheck disable=SC2086 # flags is a list of words
	$cc -std=c17 -Wall -Wextra -Werror -c "$tmp/h.c" -o "$tmp/h.o" $flags ||
		{ echo "the installed $h does not compile on its own" >&2; exit 1; }
done
# shellcheck disable=SC2086
$cc -Wall -Wextra -Werror "$src/examples/hello.c" $flags -o "$tmp/hello"
out=$(LD_LIBRARY_PATH="$root$libdir" DORMANT_BACKEND=host "$tmp/hello" 1048576)
echo "$out"
case $out in
"dormant $want, host backend: slept and woke 1048576 bytes per tag"*) ;;
*) echo "hello printed something else" >&2; exit 1 ;;
esac
# and it really runs the installed library, not the build folder's
LD_LIBRARY_PATH="$root$libdir" ldd "$tmp/hello" | grep -q "=> $root$libdir/libdormant.so" ||
	{ LD_LIBRARY_PATH="$root$libdir" ldd "$tmp/hello"; echo "hello is not linked to the installed libdormant" >&2; exit 1; }
# the soname is the ABI's, and what hello records as needed
soname=$(readelf -d "$root$libdir/libdormant.so" | sed -n 's/.*(SONAME).*\[\(.*\)\]/\1/p')
[ "$soname" = "libdormant.so.$abi" ] ||
	{ echo "the installed libdormant.so has soname '$soname', not libdormant.so.$abi" >&2; exit 1; }
[ -f "$root$libdir/libdormant.so.$abi" ] || { echo "no $libdir/libdormant.so.$abi installed" >&2; exit 1; }
readelf -d "$tmp/hello" | grep -q "(NEEDED).*\[libdormant.so.$abi\]" ||
	{ readelf -d "$tmp/hello"; echo "hello does not need libdormant.so.$abi" >&2; exit 1; }
echo "C install: ok (soname libdormant.so.$abi)"
