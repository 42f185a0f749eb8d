"""Bridge logic without sockets: telemetry parsing, answers, speed control, recording."""

import base64

import cv2
import numpy as np
import pytest

from support import hostile_jpegs

from nac_drive.data_collection.udacity_log import read_driving_log
from nac_drive.simulators.udacity_bridge import (
    Busy,
    MalformedTelemetry,
    SpeedController,
    UdacityBridge,
    parse_telemetry,
    steer_payload,
)


def _jpeg_b64(w=320, h=160, value=120):
    ok, buf = cv2.imencode(".jpg", np.full((h, w, 3), value, np.uint8))
    return base64.b64encode(buf.tobytes()).decode()


def _noise_jpeg():
    img = np.random.default_rng(0).integers(0, 255, (160, 320, 3), dtype=np.uint8)
    return cv2.imencode(".jpg", img)[1].tobytes()


def _telemetry(**over):
    d = {"steering_angle": "-2.5000", "throttle": "0.3000", "speed": "8.7500", "image": _jpeg_b64()}
    d.update(over)
    return {k: v for k, v in d.items() if v is not None}


class Recorder:
    def __init__(self, value=0.4):
        self.value, self.obs, self.resets = value, [], 0

    def reset(self):
        self.resets += 1

    def act(self, obs):
        self.obs.append(obs)
        return self.value


def test_parse_valid_telemetry_with_decimal_commas():
    tel = parse_telemetry(_telemetry(steering_angle="-2,5", speed="8,75"))
    assert tel.steering_angle == -2.5 and tel.speed == 8.75 and tel.throttle == 0.3
    assert tel.image.shape == (160, 320, 3) and tel.image.dtype == np.uint8
    assert parse_telemetry({}) is None


@pytest.mark.parametrize("data,kind", [
    ([1, 2], "not_an_object"),
    ("telemetry", "not_an_object"),
    (None, "not_an_object"),
    (_telemetry(speed=None), "missing_speed"),
    (_telemetry(throttle="fast"), "non_numeric_throttle"),
    (_telemetry(steering_angle="NaN"), "nan_steering_angle"),
    (_telemetry(speed="inf"), "nan_speed"),
    (_telemetry(steering_angle=10 ** 400), "non_numeric_steering_angle"),   # once an OverflowError: no answer
    (_telemetry(throttle=-10 ** 400), "non_numeric_throttle"),
    (_telemetry(image=None), "missing_image"),
    (_telemetry(image="not base64 !!"), "bad_base64"),
    (_telemetry(image=12), "bad_base64"),
    (_telemetry(image=base64.b64encode(b"GIF89a not a jpeg").decode()), "not_jpeg"),
    (_telemetry(image=_jpeg_b64(160, 80)), "wrong_image_size"),
])
def test_malformed_kinds(data, kind):
    with pytest.raises(MalformedTelemetry) as e:
        parse_telemetry(data)
    assert e.value.kind == kind


def test_cut_jpeg_is_malformed():
    # depending on the libjpeg build, a cut file fails to decode or decodes with a grey tail
    with pytest.raises(MalformedTelemetry) as e:
        parse_telemetry(_telemetry(image=base64.b64encode(_noise_jpeg()[:-2000]).decode()))
    assert e.value.kind in ("not_jpeg", "truncated_jpeg")


def test_png_is_not_accepted_as_jpeg():
    ok, png = cv2.imencode(".png", np.zeros((160, 320, 3), np.uint8))
    with pytest.raises(MalformedTelemetry, match="not_jpeg"):
        parse_telemetry(_telemetry(image=base64.b64encode(png.tobytes()).decode()))


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def test_a_giant_size_in_the_header_is_refused_without_decoding(monkeypatch):
    def no_decoding(*args, **kwargs):
        raise AssertionError("the image was decoded")

    monkeypatch.setattr(cv2, "imdecode", no_decoding)
    for data, claimed in ((hostile_jpegs.giant(), "30000x30000"),
                          (hostile_jpegs.claiming(hostile_jpegs.encode(), 160, 4000), "4000x160")):
        with pytest.raises(MalformedTelemetry, match=claimed) as e:
            parse_telemetry(_telemetry(image=_b64(data)))
        assert e.value.kind == "wrong_image_size"


def test_a_decoded_size_other_than_the_header_is_refused():
    data = hostile_jpegs.rotated()  # header 320x160, decoded 160x320 (EXIF orientation)
    with pytest.raises(MalformedTelemetry, match="decoded 160x320, header 320x160") as e:
        parse_telemetry(_telemetry(image=_b64(data)))
    assert e.value.kind == "wrong_image_size"


def test_steer_values_are_strings():
    payload = steer_payload(-0.25, 0.5)
    assert payload == {"steering_angle": "-0.250000", "throttle": "0.500000"}
    assert all(isinstance(v, str) for v in payload.values())


def test_bridge_answers_policy_steering_and_resets_on_connect():
    policy = Recorder(1.7)  # out of range: clipped
    bridge = UdacityBridge(policy, speed=9.0)
    assert bridge.on_connect("a") == ("steer", {"steering_angle": "0.000000", "throttle": "0.000000"})
    assert policy.resets == 1
    event, data = bridge.on_telemetry(_telemetry(), arrived=10.0)
    assert event == "steer" and data["steering_angle"] == "1.000000"
    assert float(data["throttle"]) > 0  # 8.75 mph < 9 mph set speed
    obs = policy.obs[0]
    assert obs["image"].shape == (160, 320, 3) and obs["timestamp"] == 10.0 and obs["speed"] == 8.75
    # the decoded image is the RGB frame that was sent
    assert abs(int(obs["image"][80, 160, 0]) - 120) <= 2
    assert bridge.on_telemetry({}) == ("manual", {})
    assert bridge.on_disconnect("a")
    bridge.on_connect("b")
    assert policy.resets == 2
    s = bridge.stats.summary()
    assert (s["messages"], s["answered"], s["manual"], s["malformed"]) == (2, 2, 1, 0)


def test_one_connection_drives_the_others_are_refused_and_touch_nothing():
    policy = Recorder(0.4)
    bridge = UdacityBridge(policy, speed=9.0)
    bridge.on_connect("a")
    bridge.on_telemetry(_telemetry(speed="1.0"), arrived=1.0)
    integral, last_t = bridge.controller.integral, bridge.controller.last_t
    with pytest.raises(Busy):
        bridge.on_connect("b")                       # a second client while "a" drives
    assert bridge.on_connect("a") is None             # a repeated CONNECT of the driver
    assert not bridge.on_disconnect("b")              # not the driver: the seat stays taken
    assert policy.resets == 1 and bridge.driver == "a"
    assert (bridge.controller.integral, bridge.controller.last_t) == (integral, last_t)
    assert bridge.on_disconnect("a")
    assert bridge.on_connect("b")[0] == "steer" and policy.resets == 2 and bridge.controller.last_t is None
    s = bridge.stats.summary()
    assert (s["connects"], s["refused"], s["disconnects"]) == (2, 1, 1)


def test_malformed_and_policy_failures_get_the_safe_command_and_are_logged_once(caplog):
    class Broken(Recorder):
        def act(self, obs):
            raise RuntimeError("boom")

    bridge = UdacityBridge(Broken())
    for _ in range(3):
        assert bridge.on_telemetry(_telemetry(image="%%%")) == ("steer", steer_payload(0.0, -1.0))
        assert bridge.on_telemetry(_telemetry()) == ("steer", steer_payload(0.0, -1.0))
    s = bridge.stats.summary()
    assert s["malformed"] == 3 and s["malformed_kinds"] == {"bad_base64": 3} and s["policy_errors"] == 3
    assert s["answered"] == 6
    assert sum("bad_base64" in r.message for r in caplog.records) == 1
    assert sum("boom" in r.message for r in caplog.records) == 1


def test_a_number_past_floats_range_gets_the_safe_command():
    # a 400-digit JSON integer once escaped on_telemetry as an OverflowError: no answer, a stalled simulator
    bridge = UdacityBridge(Recorder())
    for field in ("steering_angle", "throttle", "speed"):
        assert bridge.on_telemetry(_telemetry(**{field: 10 ** 400})) == ("steer", steer_payload(0.0, -1.0))
    assert bridge.stats.summary()["malformed"] == 3


def test_nan_from_the_policy_is_not_sent():
    bridge = UdacityBridge(Recorder(float("nan")))
    assert bridge.on_telemetry(_telemetry()) == ("steer", steer_payload(0.0, -1.0))


def test_pass_through_records_the_human_controls(tmp_path):
    bridge = UdacityBridge(None, record_dir=tmp_path / "rec")
    assert bridge.on_connect("a") == ("manual", {})
    assert bridge.on_telemetry(_telemetry(steering_angle="12.5", throttle="-0.4")) == ("manual", {})
    assert bridge.on_telemetry({}) == ("manual", {})
    bridge.close()
    (row,) = read_driving_log(tmp_path / "rec" / "driving_log.csv")
    assert (row.steering, row.throttle, row.brake, row.speed) == (0.5, 0.0, 0.4, 8.75)
    assert row.center.read_bytes()[:2] == b"\xff\xd8" and bridge.stats.rows_recorded == 1


def test_speed_controller_drives_a_simple_car_to_the_set_speed():
    pi = SpeedController(9.0)
    speed, t = 0.0, 0.0
    for _ in range(600):  # 40 s at 15 Hz of a first-order car: accel = 8 mph/s * throttle - drag
        throttle = pi.update(speed, t)
        speed = max(0.0, speed + (8.0 * throttle - 0.1 * speed) / 15)
        t += 1 / 15
    assert speed == pytest.approx(9.0, abs=0.1)
    assert pi.update(15.0, t + 0.1) < 0  # too fast: brake


def test_numpy_unmasking_equals_the_websocket_definition():
    pytest.importorskip("eventlet")
    from nac_drive.simulators.udacity_server import _apply_mask_numpy

    def reference(data, mask, length=None, offset=0):  # RFC 6455 5.3, byte by byte
        n = len(data) if length is None else length
        return bytes(data[i] ^ mask[(offset + i) % 4] for i in range(n))

    data = np.random.default_rng(0).integers(0, 256, 1001, dtype=np.uint8).tobytes()
    mask = (7, 200, 33, 91)
    for offset in (0, 1, 2, 3, 6):
        assert _apply_mask_numpy(data, mask, offset=offset) == reference(data, mask, offset=offset)
    assert _apply_mask_numpy(data, mask, length=10) == reference(data, mask, length=10)


def test_a_failing_recording_does_not_stop_the_driving(tmp_path, caplog):
    import shutil

    bridge = UdacityBridge(Recorder(0.2), record_dir=tmp_path / "rec")
    assert bridge.on_telemetry(_telemetry())[1]["steering_angle"] == "0.200000"
    shutil.rmtree(tmp_path / "rec" / "IMG")  # the disk goes away
    for _ in range(2):
        assert bridge.on_telemetry(_telemetry())[1]["steering_angle"] == "0.200000"
    assert bridge.stats.rows_recorded == 1 and bridge.stats.answered == 3
    assert sum("recording failed" in r.message for r in caplog.records) == 1


def test_a_bridge_listening_beyond_loopback_says_so(capsys):
    # once: --host 0.0.0.0 listened on every interface without a word
    from nac_drive.simulators.udacity_session import _loopback, _run

    assert _loopback("127.0.0.1") and _loopback("localhost") and _loopback("::1")
    assert not _loopback("0.0.0.0") and not _loopback("192.0.2.7")

    def serve(bridge, host, port, exit_on_disconnect, ready):
        ready(port)

    for host, warned in (("127.0.0.1", False), ("0.0.0.0", True)):
        assert _run(UdacityBridge(None), serve, host, 4567, json_out=True, exit_on_disconnect=False) == 0
        err = capsys.readouterr().err
        assert f"listening on {host}:4567" in err
        assert ("any machine that reaches it can take the seat" in err) == warned


def test_the_latency_record_is_bounded():
    # once a list that grew ~32 B per message for as long as the bridge ran
    from nac_drive.simulators.udacity_bridge import LATENCY_WINDOW, BridgeStats

    stats = BridgeStats()
    stats.latency_ms.extend(range(LATENCY_WINDOW + 500))
    assert len(stats.latency_ms) == LATENCY_WINDOW and stats.latency_ms[0] == 500
    assert stats.summary()["latency_ms_p50"] == 500 + (LATENCY_WINDOW - 1) / 2
