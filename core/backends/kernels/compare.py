#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""Check that a shipped PTX (core/backends/kernels/NAME.ptx: checksum, copy) is what
nvcc makes of core/backends/kernels/NAME.cu now, so a change to a kernel cannot ship
with a stale PTX. Usage: compare.py SHIPPED.ptx BUILT.ptx

The PTX text depends on the nvcc release: when the built one comes from
another release than the shipped one (its "Cuda compilation tools" line),
the texts cannot be compared and the test is skipped (exit 77); the GPU
suite still runs both on the device (test-verify, test-wake-copy).
"""
import os
import sys


def tools_line(text):
    for line in text.splitlines():
        if "Cuda compilation tools" in line:
            return line.strip()
    return None


def main():
    shipped = open(sys.argv[1], encoding="ascii").read()
    built = open(sys.argv[2], encoding="ascii").read()
    if tools_line(shipped) != tools_line(built):
        print("nvcc release differs (shipped: %s; built: %s): not compared"
              % (tools_line(shipped), tools_line(built)))
        return 77
    name = os.path.basename(sys.argv[1])[:-len(".ptx")]
    if shipped != built:
        print("core/backends/kernels/%s.ptx is stale: rebuild it with\n"
              "  nvcc -ptx -arch=compute_75 core/backends/kernels/%s.cu "
              "-o core/backends/kernels/%s.ptx" % (name, name, name))
        return 1
    print("the shipped PTX is nvcc's build of %s.cu" % name)
    return 0


if __name__ == "__main__":
    sys.exit(main())
