"""fp16's dynamic loss scaler, on the CPU (fp16 training itself runs on a GPU only)."""

from tpformer.engine.precision import LossScaler


def test_the_scale_halves_on_overflow_and_doubles_after_a_clean_window() -> None:
    scaler = LossScaler(enabled=True, initial=8.0, window=3)
    scaler.update(found_nonfinite=True)
    assert (scaler.scale, scaler.clean_steps) == (4.0, 0)
    for _ in range(2):
        scaler.update(found_nonfinite=False)
    assert (scaler.scale, scaler.clean_steps) == (4.0, 2)
    scaler.update(found_nonfinite=True)  # an overflow restarts the window
    assert (scaler.scale, scaler.clean_steps) == (2.0, 0)
    for _ in range(3):
        scaler.update(found_nonfinite=False)
    assert (scaler.scale, scaler.clean_steps) == (4.0, 0)
    for _ in range(5):
        scaler.update(found_nonfinite=True)
    assert scaler.scale == 1.0  # never below 1


def test_the_state_round_trips_and_a_disabled_scaler_stays_at_one() -> None:
    scaler = LossScaler(enabled=True, initial=16.0, window=4)
    scaler.update(found_nonfinite=False)
    restored = LossScaler(enabled=True)
    restored.load_state_dict(scaler.state_dict())
    assert (restored.scale, restored.clean_steps) == (16.0, 1)
    off = LossScaler(enabled=False, initial=16.0)
    off.update(found_nonfinite=True)
    assert off.scale == 1.0
