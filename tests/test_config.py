"""The package's settings (``set_config``, ``get_config``, ``config_context``), as
scikit-learn's behave: per thread, restored by the context, checked when set."""

import threading

import pytest

from onnxgrad_sklearn import artifacts, config_context, get_config, set_config

DEFAULTS = {
    "allow_tf32": False,
    "malloc_mmap_threshold": 4 << 20,
    "cache_dir": "default",
    "cache_max_bytes": 256 << 20,
}


def test_the_defaults():
    assert get_config() == DEFAULTS


def test_get_config_gives_a_copy():
    config = get_config()
    config["allow_tf32"] = True
    assert get_config()["allow_tf32"] is False


def test_the_context_sets_what_it_names_and_restores_everything_even_on_an_error():
    with pytest.raises(RuntimeError, match="inside"):
        with config_context(allow_tf32=True, cache_max_bytes=1000):
            assert get_config() == {**DEFAULTS, "allow_tf32": True, "cache_max_bytes": 1000}
            set_config(cache_dir="")  # changed inside the block: restored too
            raise RuntimeError("inside")
    assert get_config() == DEFAULTS


def test_set_config_changes_only_what_it_is_given():
    try:
        set_config(cache_max_bytes=10)
        set_config(allow_tf32=True)
        assert get_config() == {**DEFAULTS, "allow_tf32": True, "cache_max_bytes": 10}
    finally:
        set_config(**DEFAULTS)


def test_another_thread_starts_from_the_defaults():
    seen = {}

    def read():
        seen.update(get_config())

    with config_context(allow_tf32=True):
        thread = threading.Thread(target=read)
        thread.start()
        thread.join()
    assert seen == DEFAULTS


@pytest.mark.parametrize(
    "bad, message",
    [
        ({"allow_tf32": 1}, "allow_tf32 must be True or False"),
        ({"malloc_mmap_threshold": -1}, "malloc_mmap_threshold must be a number of bytes"),
        ({"malloc_mmap_threshold": True}, "malloc_mmap_threshold must be a number of bytes"),
        ({"cache_dir": 3}, "cache_dir must be a folder"),
        ({"cache_max_bytes": 1.5}, "cache_max_bytes must be a number of bytes"),
        ({"cache_max_bytes": -1}, "cache_max_bytes must be >= 0"),
    ],
)
def test_a_bad_value_is_refused_with_its_name_and_changes_nothing(bad, message):
    with pytest.raises(ValueError, match=message):
        set_config(**bad)
    with pytest.raises(ValueError, match=message):
        with config_context(**bad):
            pass
    assert get_config() == DEFAULTS


def test_the_cache_folder_follows_the_setting(tmp_path, monkeypatch):
    monkeypatch.delenv(artifacts.CACHE_ENV, raising=False)
    with config_context(cache_dir=tmp_path / "artifacts"):
        assert artifacts.cache_dir() == tmp_path / "artifacts"
    with config_context(cache_dir=""):
        assert artifacts.cache_dir() is None
