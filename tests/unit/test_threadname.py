"""vgpud.threadname: the kernel shows a worker thread by the name it gives."""

from __future__ import annotations

import threading
from pathlib import Path

from vgpud.threadname import name_this_thread


def test_the_kernel_shows_the_thread_by_its_name_cut_to_15_bytes() -> None:
    seen: list[str] = []

    def work() -> None:
        name_this_thread("vgpud-scan-and-more")
        comm = Path(f"/proc/self/task/{threading.get_native_id()}/comm").read_text()
        seen.append(comm.strip())

    thread = threading.Thread(target=work)
    thread.start()
    thread.join()
    assert seen == ["vgpud-scan-and-"]
    main = Path(f"/proc/self/task/{threading.get_native_id()}/comm").read_text().strip()
    assert main != "vgpud-scan-and-"  # the caller's thread alone
