"""benchmarks/sass_static.py's parsing of cuobjdump output: control bits, loops, record sites
(on canned text in cuobjdump's layout; the tool itself runs where cuobjdump is)."""
from benchmarks.sass_static import hot_loops, loops, parse_sass


def _line(addr: int, text: str, stall: int) -> str:
    # cuobjdump prints each 128-bit instruction as two 64-bit words; the stall count is bits
    # 41..44 of the second (bits 105..108 of the instruction)
    lo, hi = 0x0000000000037919, (stall << 41) | 0x000E000000000000
    return (f"        /*{addr:04x}*/                   {text} ;   /* 0x{lo:016x} */\n"
            f"                                                  /* 0x{hi:016x} */\n")


def _kernel() -> str:
    body = [(0x00, "LDC R1, c[0x0][0x28]", 1),
            (0x10, "ISETP.GE.U32.AND P1, PT, R3, R4, PT", 1),           # loop start
            (0x20, "CS2R R8, SR_GLOBALTIMERLO", 2),
            (0x30, "@!P1 STG.E.128 desc[UR6][R18.64], R8", 13),         # a record store
            (0x40, "LDG.E.NA.128.CONSTANT R20, desc[UR8][R2.64]", 4),   # a copy (cache-hinted)
            (0x50, "@P0 BRA 0x10", 5),                                  # back edge
            (0x60, "EXIT", 5)]
    return ("\t\tFunction : _Z11record_costPv\n\t.headerflags\t@\"EF_CUDA_SM90\"\n"
            + "".join(_line(a, t, s) for a, t, s in body) + "\t\t..........\n")


def test_control_bits_loops_and_record_sites():
    funcs = parse_sass(_kernel())
    instrs = funcs["_Z11record_costPv"]
    assert [i.stall for i in instrs] == [1, 1, 2, 13, 4, 5, 5]
    assert instrs[3].text == "@!P1 STG.E.128 desc[UR6][R18.64], R8"
    (loop,) = loops(instrs)
    assert (loop.start, loop.end, loop.stall) == (0x10, 0x50, 1 + 2 + 13 + 4 + 5)
    # one record (STG.E.128); the cache-hinted 128-bit load is the kernel's own traffic
    assert loop.records == 1
    assert loop.ops == "LDG.E.NA.128.CONSTANT STG.E.128 timer"
    assert hot_loops([loop]) == [loop]


def test_a_forward_branch_is_no_loop():
    text = _kernel().replace("@P0 BRA 0x10", "@P0 BRA 0x60")
    assert loops(parse_sass(text)["_Z11record_costPv"]) == []
