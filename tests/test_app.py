"""The Streamlit app renders (AppTest runs the script in-process, no browser)."""

from streamlit.testing.v1 import AppTest


def test_home_page_renders_without_exception(data_dir):
    at = AppTest.from_file("../dashboard.py", default_timeout=60).run()
    assert not at.exception
    assert at.title[0].value == "GAE Lab"
