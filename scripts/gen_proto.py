"""Generate Python code from proto/tideserve/v1/*.proto with grpcio-tools.

The generated modules live next to their .proto files under proto/tideserve/v1 and are
installed as the package `tideserve.v1`, the same path protoc derives from the include root
(`proto/`), so `from tideserve.v1 import common_pb2` works both in-tree and from a wheel.

    python scripts/gen_proto.py            # regenerate in place
    python scripts/gen_proto.py --check    # exit 1 if the checked-in code is out of date
"""

from __future__ import annotations

import argparse
import filecmp
import shutil
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PROTO_ROOT = ROOT / "proto"
PACKAGE = PROTO_ROOT / "tideserve" / "v1"
GENERATED_SUFFIXES = ("_pb2.py", "_pb2.pyi", "_pb2_grpc.py")


def generate(out_root: Path) -> list[Path]:
    import grpc_tools
    from grpc_tools import protoc  # test/dev dependency, imported only here

    protos = sorted(PACKAGE.glob("*.proto"))
    if not protos:
        raise SystemExit(f"no .proto files under {PACKAGE}")
    well_known = Path(grpc_tools.__file__).parent / "_proto"
    args = [
        "protoc",
        f"-I{PROTO_ROOT}",
        f"-I{well_known}",
        f"--python_out={out_root}",
        f"--pyi_out={out_root}",
        f"--grpc_python_out={out_root}",
        *[str(p.relative_to(PROTO_ROOT)) for p in protos],
    ]
    rc = protoc.main(args)
    if rc != 0:
        raise SystemExit(f"protoc failed with exit code {rc}")
    return sorted(
        p for p in (out_root / "tideserve" / "v1").iterdir() if p.name.endswith(GENERATED_SUFFIXES)
    )


def existing() -> list[Path]:
    return sorted(p for p in PACKAGE.iterdir() if p.name.endswith(GENERATED_SUFFIXES))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="fail if generated code is stale")
    ns = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        fresh = generate(Path(tmp))
        if ns.check:
            old = {p.name: p for p in existing()}
            new = {p.name: p for p in fresh}
            stale = sorted(set(old) ^ set(new))
            stale += [
                n
                for n in sorted(set(old) & set(new))
                if not filecmp.cmp(old[n], new[n], shallow=False)
            ]
            if stale:
                print(
                    "generated protobuf code is out of date: " + ", ".join(stale), file=sys.stderr
                )
                print("run: python scripts/gen_proto.py", file=sys.stderr)
                return 1
            print(f"generated protobuf code is current ({len(fresh)} files)")
            return 0
        for p in existing():
            p.unlink()
        for p in fresh:
            shutil.copy2(p, PACKAGE / p.name)
        print(f"wrote {len(fresh)} files to {PACKAGE.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
