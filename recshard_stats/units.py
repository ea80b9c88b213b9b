"""The units every stage shares, in one place. Costs are seconds inside the library and
milliseconds in the manifest and reports; sizes are bytes; TorchRec's Topology takes bandwidths
in bytes/ms (test_torchrec checks that against its defaults)."""

from __future__ import annotations

MS_PER_S = 1000.0  # seconds -> milliseconds (and bytes/s -> bytes/ms: divide)
US, NS, PS = 1e-6, 1e-9, 1e-12  # seconds in a micro-, nano- and picosecond (the calibration file's units)
KIB, MIB, GIB, TIB = 1024, 1024**2, 1024**3, 1024**4


def fmt_bytes(n: float) -> str:
    """Human-readable bytes for error messages and reports."""
    for unit, size in (("TiB", TIB), ("GiB", GIB), ("MiB", MIB), ("KiB", KIB)):
        if abs(n) >= size:
            return f"{n / size:.2f} {unit}"
    return f"{n:.0f} B"
