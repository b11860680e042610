"""fp16's dynamic loss scaler, on the CPU (fp16 training itself runs on a GPU only): device
tensors, updated without a host read."""

from tpformer.engine.precision import LossScaler


def _state(scaler: LossScaler) -> tuple[float, int]:
    return float(scaler.scale), int(scaler.clean_steps)


def test_the_scale_halves_on_overflow_and_doubles_after_a_clean_window() -> None:
    scaler = LossScaler(enabled=True, initial=8.0, window=3)
    scaler.update(found_nonfinite=True)
    assert _state(scaler) == (4.0, 0)
    for _ in range(2):
        scaler.update(found_nonfinite=False)
    assert _state(scaler) == (4.0, 2)
    scaler.update(found_nonfinite=True)  # an overflow restarts the window
    assert _state(scaler) == (2.0, 0)
    for _ in range(3):
        scaler.update(found_nonfinite=False)
    assert _state(scaler) == (4.0, 0)
    for _ in range(5):
        scaler.update(found_nonfinite=True)
    assert float(scaler.scale) == 1.0  # never below 1


def test_the_state_round_trips_and_a_disabled_scaler_stays_at_one() -> None:
    scaler = LossScaler(enabled=True, initial=16.0, window=4)
    scaler.update(found_nonfinite=False)
    restored = LossScaler(enabled=True)
    restored.load_state_dict(scaler.state_dict())
    assert _state(restored) == (16.0, 1)
    off = LossScaler(enabled=False, initial=16.0)
    off.update(found_nonfinite=True)
    assert float(off.scale) == 1.0
