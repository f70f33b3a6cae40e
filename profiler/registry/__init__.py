"""What phases mean, and the one source of what host and device share.

    registry.py   a kernel family's phase registry (`<package>/phases/<family>.toml`): phases,
                  waits, barriers; the search path ([tool.epscope] registry_dirs)
    codegen.py    profiler/layout.toml and every registry -> CUDA headers (csrc/generated/) and
                  Python tables (generated/) of the package that owns them (`--check` in CI)
"""
