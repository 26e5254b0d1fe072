"""Which instruction makes ptxas serialize the overlapped forward's wgmmas (C7513)?

Input: the PTX of the overlapped Hopper forward as it was before the fix
(head_dim 128, one program per tile, `pingpong=False, overlap=True`), dumped
by Mosaic GPU with MOSAIC_GPU_DUMP_PTX=1 while running
`python -m harness.attention_once --backend mosaic --seq 4096 --heads 16 --head-dim 128
 --blocks persistent=false,pingpong=false,overlap=true` at commit 6aef810.

Assembles three versions with ptxas (sm_90a) and reports whether C7513 is
raised and how many bytes spill:
  original                the PTX as dumped;
  wait-for-both           every `wgmma.wait_group 1` made `wait_group 0`
                          (the softmax no longer runs while P V is in flight);
  convert-after-wait      the float32 -> bf16 conversions of P that sit between
                          a `wait_group 1` and the next `wait_group 0` moved to
                          just after that `wait_group 0`.
usage: python c7513_experiment.py overlap-fwd-d128.ptx.gz
"""
import gzip
import re
import subprocess
import sys
import tempfile
from pathlib import Path


def assemble(lines: list[str], tag: str) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        ptx = Path(tmp) / f"{tag}.ptx"
        ptx.write_text("\n".join(lines))
        log = subprocess.run(["ptxas", "-arch=sm_90a", "-v", str(ptx), "-o", str(Path(tmp) / "k.cubin")],
                             capture_output=True, text=True).stderr
    spills = re.findall(r"(\d+) bytes spill stores", log)
    print(f"{tag:20s} C7513: {'yes' if 'C7513' in log else 'no '}  spill stores: {spills[0] if spills else '?'} bytes")


def convert_after_wait(lines: list[str]) -> list[str]:
    out, held, window = [], [], False
    for line in lines:
        if "wgmma.wait_group.sync.aligned 1;" in line:
            window = True
        if window and "cvt.rn.bf16x2.f32" in line:
            held.append(line)
            continue
        out.append(line)
        if "wgmma.wait_group.sync.aligned 0;" in line and window:
            out += held
            held, window = [], False
    return out


lines = gzip.open(sys.argv[1], "rt").read().split("\n")
print(subprocess.run(["ptxas", "--version"], capture_output=True, text=True).stdout.strip().splitlines()[-1])
assemble(lines, "original")
assemble([l.replace("wgmma.wait_group.sync.aligned 1;", "wgmma.wait_group.sync.aligned 0;") for l in lines],
         "wait-for-both")
assemble(convert_after_wait(lines), "convert-after-wait")
