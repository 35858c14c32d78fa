"""pytest plugin: replace decode_attention's module settings from ATTN_OVERRIDES ("NAME=VALUE ...") before
the tests run (pytest -p attn_plugin, with this folder on PYTHONPATH)."""
import os


def pytest_configure(config):
    from engine.model import decode_attention as A
    for item in os.environ.get("ATTN_OVERRIDES", "").split():
        name, value = item.split("=")
        assert hasattr(A, name), name
        setattr(A, name, int(value))
    print("attention overrides:", os.environ.get("ATTN_OVERRIDES", ""))
