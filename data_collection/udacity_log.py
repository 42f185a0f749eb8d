"""Udacity Term-1 simulator recordings: ``driving_log.csv`` + ``IMG/``, read and written.

The simulator's training mode writes one row per frame, without a header::

    /abs/IMG/center_2016_12_01_13_30_48_287.jpg,/abs/IMG/left_...jpg,/abs/IMG/right_...jpg,0,0,0,22.14829

columns: center, left, right, steering (-1..1, positive = right), throttle (0..1),
brake (0..1), speed (mph). Variants this reader accepts:

- Udacity's sample data: a header row (``center,left,right,steering,...``), paths relative
  to the CSV's folder and ``", "`` separators;
- Windows recordings: absolute paths with backslashes (resolved by file name in the
  CSV's ``IMG/`` folder when the absolute path does not exist here);
- decimal commas (a simulator run under e.g. a German locale): quoted (``"0,5"``),
  semicolon-separated, or unquoted, where ``0,5`` splits into two CSV cells. The unquoted
  case is resolved using the value ranges of the columns; a row that stays ambiguous
  (``0,21,5``: brake 0.21 and speed 5, or brake 0 and speed 21.5?) is an error naming
  the file and row.

Recordings made by the bridge contain only the centre camera: their left and right cells
are empty and read back as ``None``.
"""

from __future__ import annotations

import csv
import datetime as _dt
import io
import itertools
import math
import os
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np

HEADER = ("center", "left", "right", "steering", "throttle", "brake", "speed")
# Plausible value ranges, used to validate rows and to split unquoted decimal commas.
_RANGES = {
    "steering": (-1.0, 1.0),
    "throttle": (-1.0, 1.0),
    "brake": (0.0, 1.0),
    "speed": (0.0, 200.0),
}
_NUMERIC = ("steering", "throttle", "brake", "speed")
_STAMP = re.compile(r"(\d{4})_(\d{2})_(\d{2})_(\d{2})_(\d{2})_(\d{2})_(\d{3})")


class DrivingLogError(ValueError):
    """A driving_log.csv that cannot be read; the message names the file and row."""


def parse_decimal(text: str | float | int) -> float:
    """Parse a number written with a decimal point or a decimal comma ("12,5" -> 12.5).

    Raises ValueError for anything else (empty strings, words, "1,234,5", an integer past
    float's range).
    NaN and infinities parse (the caller decides whether they are acceptable).
    """
    if isinstance(text, (int, float)) and not isinstance(text, bool):
        try:
            return float(text)
        except OverflowError:   # an int past float's range (a JSON number of 400 digits)
            raise ValueError("not a number a float can hold: an integer of "
                             f"{len(str(abs(text)))} digits") from None
    if not isinstance(text, str):
        raise ValueError(f"not a number: {text!r}")
    s = text.strip()
    if s.count(",") == 1 and "." not in s:
        s = s.replace(",", ".")
    return float(s)


def timestamp_from_name(path: str | os.PathLike) -> float | None:
    """Seconds since the epoch encoded in ``center_YYYY_MM_DD_HH_MM_SS_mmm.jpg``, or None."""
    m = _STAMP.search(Path(str(path).replace("\\", "/")).name)
    if not m:
        return None
    y, mo, d, h, mi, s, ms = (int(g) for g in m.groups())
    when = _dt.datetime(y, mo, d, h, mi, s, ms * 1000, tzinfo=_dt.timezone.utc)
    return when.timestamp()


def image_name(camera: str, when: _dt.datetime, take: int = 1) -> str:
    """The simulator's image file name, e.g. ``center_2016_12_01_13_30_48_287.jpg``; take
    k > 1 (a later recording of the same instant in one folder) ends in ``-k``:
    ``center_2016_12_01_13_30_48_287-2.jpg``."""
    return f"{camera}_{when:%Y_%m_%d_%H_%M_%S}_{when.microsecond // 1000:03d}{f'-{take}' if take > 1 else ''}.jpg"


@dataclass
class DrivingLogRow:
    """One frame of a recording. Paths are resolved to files on this machine."""

    center: Path
    left: Path | None
    right: Path | None
    steering: float
    throttle: float
    brake: float
    speed: float
    timestamp: float | None  # seconds, from the centre image's file name (None if absent)
    row: int  # 1-based row number in the CSV (for error messages)


def _resolve(cell: str, base: Path) -> Path | None:
    cell = cell.strip()
    if not cell:
        return None
    p = Path(cell)
    if p.is_absolute() and p.exists():
        return p
    unix = cell.replace("\\", "/")
    candidates = [base / unix]
    # Absolute path from another machine (Windows or another user's folder): look it up
    # by file name in this recording's IMG/ folder.
    candidates.append(base / "IMG" / Path(unix).name)
    for c in candidates:
        if c.exists():
            return c
    # Keep the most plausible location; a missing image is reported when it is loaded.
    return candidates[0] if not (p.is_absolute() or re.match(r"^[A-Za-z]:", unix)) else candidates[1]


def _group_numbers(cells: list[str]) -> list[float] | None:
    """Split 4..8 unquoted cells into the 4 numeric columns (decimal commas split a number
    into integer and fraction cells). Returns None when no or several splits fit."""
    fits = []
    for widths in itertools.product((1, 2), repeat=4):
        if sum(widths) != len(cells):
            continue
        values, i, ok = [], 0, True
        for name, w in zip(_NUMERIC, widths):
            part = cells[i:i + w]
            i += w
            if w == 2 and not (re.fullmatch(r"-?\d+", part[0].strip()) and re.fullmatch(r"\d+", part[1].strip())):
                ok = False
                break
            if w == 1 and part[0].strip() == "-0":  # "-0" only occurs as the integer part of "-0,x"
                ok = False
                break
            try:
                v = float(".".join(c.strip() for c in part))
            except ValueError:
                ok = False
                break
            lo, hi = _RANGES[name]
            if not lo <= v <= hi:
                ok = False
                break
            values.append(v)
        if ok:
            fits.append(values)
    return fits[0] if len(fits) == 1 else None


def _split_line(line: str) -> list[str]:
    delimiter = ";" if line.count(";") >= 6 else ","
    return next(csv.reader(io.StringIO(line), delimiter=delimiter, skipinitialspace=True))


def read_driving_log(path: str | os.PathLike) -> list[DrivingLogRow]:
    """Read every row of a driving_log.csv (any variant in the module docstring).

    Raises DrivingLogError naming the file and the 1-based row on corrupt input. A final
    line without its newline (a recording killed mid-write) is read if it is complete and
    dropped silently if it is cut short.
    """
    path = Path(path)
    base = path.parent
    try:
        text = path.read_text(encoding="utf-8-sig")
    except OSError as e:
        raise DrivingLogError(f"{path}: cannot read: {e}") from e
    lines = text.splitlines()
    rows: list[DrivingLogRow] = []
    for n, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        cells = _split_line(line)
        if n == 1 and cells and cells[0].strip().lower() == "center":
            continue  # header of Udacity's sample data
        last_line_cut = n == len(lines) and not text.endswith(("\n", "\r"))
        try:
            rows.append(_parse_row(cells, base, n))
        except DrivingLogError:
            if last_line_cut:
                break
            raise DrivingLogError(f"{path}, row {n}: {_parse_error(cells)}: {line!r}") from None
    return rows


def _parse_error(cells: list[str]) -> str:
    if len(cells) < 7:
        return f"expected 7 columns (center,left,right,steering,throttle,brake,speed), got {len(cells)}"
    return "cannot read steering/throttle/brake/speed as numbers in range"


def _parse_row(cells: list[str], base: Path, n: int) -> DrivingLogRow:
    if len(cells) < 7 or len(cells) > 11 or not cells[0].strip():
        raise DrivingLogError
    numbers = cells[3:]
    if len(numbers) == 4:
        try:
            values = [parse_decimal(c) for c in numbers]
        except ValueError:
            values = None
        if values is not None and not all(
            math.isfinite(v) and lo <= v <= hi for v, (lo, hi) in zip(values, _RANGES.values())
        ):
            values = None
    else:
        values = _group_numbers(numbers)
    if values is None:
        raise DrivingLogError
    center = _resolve(cells[0], base)
    return DrivingLogRow(
        center=center,
        left=_resolve(cells[1], base),
        right=_resolve(cells[2], base),
        steering=values[0],
        throttle=values[1],
        brake=values[2],
        speed=values[3],
        timestamp=timestamp_from_name(cells[0]),
        row=n,
    )


def check_images(rows: list[DrivingLogRow], log: str | os.PathLike, shown: int = 3) -> None:
    """Raise :class:`DrivingLogError` if an image the rows name (any camera) is not a file,
    naming the log, how many are missing and the first ``shown`` of them: better now than
    when a training batch first reaches one; or if two rows name the same image, naming
    both rows: one frame cannot carry two labels, so a later recording overwrote it."""
    owner: dict[Path, int] = {}
    for r in rows:
        for p in (r.center, r.left, r.right):
            if p is None:
                continue
            first = owner.setdefault(Path(os.path.abspath(p)), r.row)
            if first != r.row:
                raise DrivingLogError(f"{log}, row {r.row}: its image {p} is row {first}'s as well (overwritten by a "
                                      "later recording: its labels no longer match it); record into a new folder")
    listed = [p for r in rows for p in (r.center, r.left, r.right) if p is not None]
    missing = [p for p in listed if not p.is_file()]
    if missing:
        first = ", ".join(str(p) for p in missing[:shown])
        raise DrivingLogError(f"{log}: {len(missing)} of the {len(listed)} images it lists are missing "
                              f"(first: {first}{', ...' if len(missing) > shown else ''})")


def load_rgb(path: str | os.PathLike) -> np.ndarray:
    """Read an image file as uint8 RGB [H, W, 3]; raises FileNotFoundError naming the file."""
    import cv2

    bgr = cv2.imread(str(path), cv2.IMREAD_COLOR)
    if bgr is None:
        raise FileNotFoundError(f"cannot read image {path}")
    return cv2.cvtColor(bgr, cv2.COLOR_BGR2RGB)


class DrivingLogWriter:
    """Write a recording in the simulator's own training format.

    ``out_dir/driving_log.csv`` (no header, absolute paths, dot decimals) and
    ``out_dir/IMG/<camera>_YYYY_MM_DD_HH_MM_SS_mmm.jpg``. Images are written before their
    row, and each row is written with one ``write`` and flushed, so a process killed at
    any moment loses at most the row being written and the CSV always parses. File names
    get strictly increasing milliseconds even when frames arrive faster than 1 kHz.

    A recording into a folder that holds one appends whole new rows with new files: an
    image file is only ever created, never opened for writing if it exists (``O_EXCL``).
    Where the simulator's name is taken (an earlier recording, or a concurrent one, made
    a frame at that time), this recording takes the name's first free *take*,
    ``<camera>_YYYY_MM_DD_HH_MM_SS_mmm-<k>.jpg`` (k = 2, 3, ...), and keeps it for its
    later frames; the time stamp in the name keeps its meaning.
    """

    def __init__(self, out_dir: str | os.PathLike):
        self.out_dir = Path(out_dir).resolve()
        self.img_dir = self.out_dir / "IMG"
        self.img_dir.mkdir(parents=True, exist_ok=True)
        self.csv_path = self.out_dir / "driving_log.csv"
        self._file = open(self.csv_path, "a", encoding="utf-8", newline="")
        self._last: _dt.datetime | None = None
        self._take = 1   # 1: the simulator's own names; k > 1: names ending in -k
        self.rows = 0

    def _stamp(self, when: _dt.datetime | None) -> _dt.datetime:
        when = when or _dt.datetime.now()
        when = when.replace(microsecond=(when.microsecond // 1000) * 1000)
        if self._last is not None and when <= self._last:
            when = self._last + _dt.timedelta(milliseconds=1)
        self._last = when
        return when

    def _save(self, camera: str, image, when: _dt.datetime) -> str:
        """image: JPEG bytes (written as is) or uint8 RGB array [H, W, 3]."""
        import cv2

        if isinstance(image, (bytes, bytearray)):
            data = bytes(image)
        else:
            ok, buf = cv2.imencode(".jpg", cv2.cvtColor(np.asarray(image), cv2.COLOR_RGB2BGR))
            if not ok:
                raise ValueError("cannot encode image as JPEG")
            data = buf.tobytes()
        while True:
            path = self.img_dir / image_name(camera, when, self._take)
            try:
                f = open(path, "xb")   # O_EXCL: another recording's frame is never overwritten
            except FileExistsError:
                self._take += 1
                continue
            try:
                with f:
                    f.write(data)
            except OSError:
                path.unlink(missing_ok=True)   # no half-written image for a later row to find
                raise
            return str(path)

    def write(self, center, steering: float, throttle: float, brake: float, speed: float,
              left=None, right=None, when: _dt.datetime | None = None) -> Path:
        """Append one frame; ``center``/``left``/``right`` are JPEG bytes or RGB arrays
        (left/right may be None). Returns the centre image's path."""
        when = self._stamp(when)
        paths = [self._save(cam, img, when) if img is not None else ""
                 for cam, img in (("center", center), ("left", left), ("right", right))]
        numbers = ",".join(f"{float(v):.6g}" for v in (steering, throttle, brake, speed))
        self._file.write(f"{paths[0]},{paths[1]},{paths[2]},{numbers}\n")
        self._file.flush()
        self.rows += 1
        return Path(paths[0])

    def close(self) -> None:
        if not self._file.closed:
            self._file.close()

    def __enter__(self) -> "DrivingLogWriter":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
