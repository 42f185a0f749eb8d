"""driving_log.csv reader/writer: every variant the simulator and Udacity's sample data produce."""

import datetime as dt

import cv2
import numpy as np
import pytest

from nac_drive.data_collection.udacity_log import (
    DrivingLogError,
    DrivingLogWriter,
    load_rgb,
    parse_decimal,
    read_driving_log,
    timestamp_from_name,
)


def _img(path, value=100):
    path.parent.mkdir(parents=True, exist_ok=True)
    cv2.imwrite(str(path), np.full((160, 320, 3), value, np.uint8))
    return path


def _names(tmp_path, n=2):
    out = []
    for k in range(n):
        stamp = f"2016_12_01_13_30_48_{287 + 67 * k:03d}"
        out.append([_img(tmp_path / "IMG" / f"{cam}_{stamp}.jpg", 50 * k + 10) for cam in ("center", "left", "right")])
    return out


def test_parse_decimal_accepts_point_and_comma_and_rejects_garbage():
    assert parse_decimal("12.5") == 12.5
    assert parse_decimal("12,5") == 12.5
    assert parse_decimal(" -0,0123 ") == pytest.approx(-0.0123)
    for bad in ("", "abc", "1,234,5", "1.2,3", None):
        with pytest.raises(ValueError):
            parse_decimal(bad)


def test_simulator_format_no_header_absolute_paths(tmp_path):
    imgs = _names(tmp_path)
    lines = [f"{c},{l},{r},{s},0.5,0,{v}" for (c, l, r), s, v in zip(imgs, (-0.1, 0.2), (20.1, 21.5))]
    (tmp_path / "driving_log.csv").write_text("\n".join(lines) + "\n")
    rows = read_driving_log(tmp_path / "driving_log.csv")
    assert [r.steering for r in rows] == [-0.1, 0.2]
    assert [r.speed for r in rows] == [20.1, 21.5]
    assert rows[0].center == imgs[0][0] and rows[1].right == imgs[1][2]
    assert rows[1].timestamp - rows[0].timestamp == pytest.approx(0.067, abs=1e-6)
    assert load_rgb(rows[1].center)[0, 0, 0] == 60


def test_udacity_sample_data_header_relative_paths_and_comma_space(tmp_path):
    _names(tmp_path)
    text = ("center,left,right,steering,throttle,brake,speed\n"
            "IMG/center_2016_12_01_13_30_48_287.jpg, IMG/left_2016_12_01_13_30_48_287.jpg, "
            "IMG/right_2016_12_01_13_30_48_287.jpg, 0, 0, 0, 22.14829\n"
            "IMG/center_2016_12_01_13_30_48_354.jpg, IMG/left_2016_12_01_13_30_48_354.jpg, "
            "IMG/right_2016_12_01_13_30_48_354.jpg, -0.05, 0.9855326, 0, 21.87963\n")
    (tmp_path / "driving_log.csv").write_text(text)
    rows = read_driving_log(tmp_path / "driving_log.csv")
    assert len(rows) == 2 and rows[1].throttle == pytest.approx(0.9855326) and rows[1].steering == -0.05
    assert rows[0].left == tmp_path / "IMG" / "left_2016_12_01_13_30_48_287.jpg"
    assert rows[1].center.exists() and rows[1].row == 3


def test_windows_backslash_paths_resolve_to_local_img_folder(tmp_path):
    _names(tmp_path, 1)
    base = r"C:\Users\me\Desktop\data\IMG"
    stamp = "2016_12_01_13_30_48_287"
    line = f"{base}\\center_{stamp}.jpg,{base}\\left_{stamp}.jpg,{base}\\right_{stamp}.jpg,0.1,0.2,0,9.5\n"
    (tmp_path / "driving_log.csv").write_text(line)
    (row,) = read_driving_log(tmp_path / "driving_log.csv")
    assert row.center == tmp_path / "IMG" / f"center_{stamp}.jpg" and row.center.exists()
    assert row.right.exists() and row.timestamp is not None


@pytest.mark.parametrize("numbers,expected", [
    ('"0,5","0,25","0","12,75"', [0.5, 0.25, 0.0, 12.75]),  # quoted cells
    ("-0,1,0,9,0,21", [-0.1, 0.9, 0.0, 21.0]),  # unquoted: each decimal comma splits a cell
    ("0,0,0,0", [0.0, 0.0, 0.0, 0.0]),  # zeros carry no decimal part
    ("0,25,1,0,30", [0.25, 1.0, 0.0, 30.0]),
])
def test_decimal_commas(tmp_path, numbers, expected):
    (tmp_path / "driving_log.csv").write_text(f"/a/IMG/center_2016_12_01_13_30_48_287.jpg,,,{numbers}\n")
    (row,) = read_driving_log(tmp_path / "driving_log.csv")
    assert [row.steering, row.throttle, row.brake, row.speed] == pytest.approx(expected)
    assert row.left is None and row.right is None


def test_ambiguous_unquoted_decimal_commas_are_an_error_naming_the_row(tmp_path):
    path = tmp_path / "driving_log.csv"
    path.write_text("/a/c.jpg,,,-0,1,0,9,0,21,5\n")  # brake 0.21 + speed 5, or brake 0 + speed 21.5
    with pytest.raises(DrivingLogError, match="row 1"):
        read_driving_log(path)


def test_semicolon_separated_decimal_commas(tmp_path):
    (tmp_path / "driving_log.csv").write_text("/a/center_2016_12_01_13_30_48_287.jpg;/a/l.jpg;/a/r.jpg;-0,3;0,5;0;11,25\n")
    (row,) = read_driving_log(tmp_path / "driving_log.csv")
    assert [row.steering, row.throttle, row.brake, row.speed] == pytest.approx([-0.3, 0.5, 0.0, 11.25])


@pytest.mark.parametrize("bad_line,why", [
    ("/a/c.jpg,/a/l.jpg,/a/r.jpg,0.1,abc,0,10", "numbers"),
    ("/a/c.jpg,/a/l.jpg,/a/r.jpg,0.1", "7 columns"),
    ("/a/c.jpg,/a/l.jpg,/a/r.jpg,0.1,0.2,0,nan", "numbers"),
    ("/a/c.jpg,/a/l.jpg,/a/r.jpg,5.0,0.2,0,10", "numbers"),  # steering out of -1..1
])
def test_corrupt_row_error_names_file_and_row(tmp_path, bad_line, why):
    path = tmp_path / "driving_log.csv"
    path.write_text("/a/c.jpg,/a/l.jpg,/a/r.jpg,0.1,0.2,0,10\n" + bad_line + "\n/a/c.jpg,,,0,0,0,1\n")
    with pytest.raises(DrivingLogError) as e:
        read_driving_log(path)
    assert str(path) in str(e.value) and "row 2" in str(e.value) and why in str(e.value)


def test_cut_last_line_of_killed_recording_is_dropped(tmp_path):
    path = tmp_path / "driving_log.csv"
    path.write_text("/a/c.jpg,/a/l.jpg,/a/r.jpg,0.1,0.2,0,10\n/a/c2.jpg,/a/l2.jpg,/a/r2")
    assert len(read_driving_log(path)) == 1


def test_writer_round_trip_and_file_names(tmp_path):
    when = dt.datetime(2026, 3, 4, 5, 6, 7, 891000)
    rgb = np.zeros((160, 320, 3), np.uint8)
    rgb[..., 0] = 200  # red in RGB
    with DrivingLogWriter(tmp_path / "rec") as w:
        p0 = w.write(rgb, -0.25, 0.5, 0.0, 12.5, left=rgb, right=rgb, when=when)
        p1 = w.write(rgb, 0.75, 0.0, 0.3, 3.0, when=when)  # same millisecond: bumped by 1 ms
    assert p0.name == "center_2026_03_04_05_06_07_891.jpg" and p1.name == "center_2026_03_04_05_06_07_892.jpg"
    text = (tmp_path / "rec" / "driving_log.csv").read_text()
    assert not text.startswith("center") and text.count("\n") == 2
    rows = read_driving_log(tmp_path / "rec" / "driving_log.csv")
    assert [(r.steering, r.throttle, r.brake, r.speed) for r in rows] == [(-0.25, 0.5, 0.0, 12.5), (0.75, 0.0, 0.3, 3.0)]
    assert rows[0].center.is_absolute() and rows[0].left.exists() and rows[1].left is None
    img = load_rgb(rows[0].center)
    assert img.shape == (160, 320, 3) and img[80, 160, 0] > 180 and img[80, 160, 2] < 30  # stays RGB
    assert rows[1].timestamp - rows[0].timestamp == pytest.approx(0.001, abs=1e-6)
    assert timestamp_from_name("center_2026_03_04_05_06_07_891.jpg") == rows[0].timestamp


def test_missing_images_are_found_when_the_log_is_loaded(tmp_path, capsys):
    from nac_drive.cli import main
    from nac_drive.data_collection.udacity_dataset import segments_from_log

    imgs = _names(tmp_path / "rec", 3)
    lines = [f"{c},{l},{r},0.1,0.5,0,20" for c, l, r in imgs]
    (tmp_path / "rec" / "driving_log.csv").write_text("\n".join(lines) + "\n")
    assert [len(s.rows) for s in segments_from_log(tmp_path / "rec" / "driving_log.csv")] == [3]
    for gone in (imgs[1][0], imgs[2][0], imgs[2][2], imgs[0][1]):   # 4 of the 9 images
        gone.unlink()
    message = (rf"driving_log.csv: 4 of the 9 images it lists are missing \(first: {imgs[0][1]}, {imgs[1][0]}, "
               rf"{imgs[2][0]}, \.\.\.\)")
    with pytest.raises(DrivingLogError, match=message):
        segments_from_log(tmp_path / "rec" / "driving_log.csv")
    # training refuses it at load, before the first batch, in one line
    assert main(["train", "--data", str(tmp_path), "--out", str(tmp_path / "runs"), "--no-progress"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "4 of the 9 images it lists are missing" in err[0]
    assert not (tmp_path / "runs").exists()


def test_class_weighting_on_continuous_steering_is_refused_before_a_run_folder(tmp_path, capsys):
    from nac_drive.cli import main

    with DrivingLogWriter(tmp_path / "rec") as w:
        for k in range(20):
            w.write(np.full((160, 320, 3), 10 * k, np.uint8), 0.01 * k, 0.5, 0.0, 9.0,
                    when=dt.datetime(2026, 3, 4, 5, 6, 7) + dt.timedelta(seconds=k / 15))
    args = ["train", "--data", str(tmp_path), "--out", str(tmp_path / "runs"), "--window", "4", "--epochs", "1",
            "--windows-per-epoch", "32", "--batch-size", "4", "--no-progress"]
    assert main([*args, "--class-weighting", "balanced"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--class-weighting balanced" in err[0] and "continuous actions" in err[0]
    assert not (tmp_path / "runs").exists()


def test_two_rows_naming_one_image_are_refused_naming_the_row(tmp_path):
    """A log whose rows share an image (a later recording overwrote it: one frame, two
    labels) is refused when loaded, in one line naming the row and the row it repeats."""
    from nac_drive.data_collection.udacity_dataset import segments_from_log

    imgs = _names(tmp_path, 3)
    lines = [f"{c},{l},{r},{0.1 * k},0.5,0,20" for k, (c, l, r) in enumerate(imgs)]
    lines.append(f"{imgs[1][0]},,,-0.4,0.5,0,20")   # row 4: row 2's centre frame, another label
    (tmp_path / "driving_log.csv").write_text("\n".join(lines) + "\n")
    with pytest.raises(DrivingLogError) as e:
        segments_from_log(tmp_path / "driving_log.csv")
    assert str(e.value).startswith(f"{tmp_path / 'driving_log.csv'}, row 4: its image {imgs[1][0]} is row 2's")
    assert "\n" not in str(e.value)


def test_the_writer_never_overwrites_an_image_it_did_not_write(tmp_path):
    """An image left at a name (an earlier recording's, or one killed before its row) is
    kept; the new frame takes the name's next take, the same time stamp."""
    when = dt.datetime(2026, 3, 4, 5, 6, 7, 891000)
    taken = _img(tmp_path / "rec" / "IMG" / "center_2026_03_04_05_06_07_891.jpg", 7)
    before = taken.read_bytes()
    with DrivingLogWriter(tmp_path / "rec") as w:
        p0 = w.write(np.zeros((160, 320, 3), np.uint8), 0.5, 0.5, 0.0, 10.0, when=when)
        p1 = w.write(np.zeros((160, 320, 3), np.uint8), 0.5, 0.5, 0.0, 10.0, when=when)
    assert taken.read_bytes() == before
    assert (p0.name, p1.name) == ("center_2026_03_04_05_06_07_891-2.jpg", "center_2026_03_04_05_06_07_892-2.jpg")
    rows = read_driving_log(tmp_path / "rec" / "driving_log.csv")
    assert [r.timestamp for r in rows] == pytest.approx([timestamp_from_name(taken), timestamp_from_name(taken) + 0.001])
