"""`python no_dac_resume.py DB EFFECTS`: resume thread t1 of DB with an approval, as root without the DAC-override
capabilities (CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH), so file modes apply to it as to any other user; print the
outcome as one JSON line (`{"ok": true, "status": ...}` or the exception's type and message).

The process drops the two capabilities itself, before it opens anything: from its bounding set (PR_CAPBSET_DROP)
and from its effective, permitted and inheritable sets (capset(2)), the sets `setpriv --inh-caps=-dac_override,...
--bounding-set=-dac_override,...` leaves a root process with after exec. It then reads them back from
/proc/self/status and exits 3 if either is still there. Doing it in the process, not with setpriv(1) in front of a
new interpreter, lets the test fork it from the preloaded server (support/preloaded.py): each attempt is still a
process of its own, without a second of third-party imports first.
"""

from __future__ import annotations

import ctypes
import json
import sys

CAPS = {"dac_override": 1, "dac_read_search": 2}  # linux/capability.h
PR_CAPBSET_DROP = 24
LINUX_CAPABILITY_VERSION_3 = 0x20080522


class _Header(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _Data(ctypes.Structure):
    _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32), ("inheritable", ctypes.c_uint32)]


def drop_dac_override() -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    for cap in CAPS.values():
        if libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_CAPBSET_DROP)")
    header, data = _Header(LINUX_CAPABILITY_VERSION_3, 0), (_Data * 2)()
    if libc.capget(ctypes.byref(header), data) != 0:
        raise OSError(ctypes.get_errno(), "capget")
    mask = ~sum(1 << cap for cap in CAPS.values()) & 0xFFFFFFFF  # both are below 32: the first of the two words
    data[0].effective &= mask
    data[0].permitted &= mask
    data[0].inheritable &= mask
    if libc.capset(ctypes.byref(header), data) != 0:
        raise OSError(ctypes.get_errno(), "capset")


def still_held() -> list[str]:
    """The two capabilities as /proc/self/status shows this process holding them (effective or bounding set)."""
    with open("/proc/self/status") as status:
        sets = {k: int(v, 16) for k, _, v in (line.partition(":\t") for line in status) if k in ("CapEff", "CapBnd")}
    return [name for name, cap in CAPS.items() if any(held >> cap & 1 for held in sets.values())]


if __name__ == "__main__":
    drop_dac_override()
    if held := still_held():
        print(f"still holds {held}", file=sys.stderr)
        sys.exit(3)

    from sample_app import Effects, build

    from gatedloop.checkpoints import open_sqlite
    from gatedloop.graph import runs

    try:
        with open_sqlite(sys.argv[1]) as saver:
            graph = build(saver, Effects(sys.argv[2]))
            out = runs.resume(graph, "t1", {"decisions": [{"type": "approve"}]})
            print(json.dumps({"ok": True, "status": out.get("status")}))
    except Exception as exc:
        print(json.dumps({"ok": False, "type": f"{type(exc).__module__}.{type(exc).__name__}", "message": str(exc)}))
