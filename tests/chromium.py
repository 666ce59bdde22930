"""Debian's headless Chromium driven by Selenium (chromium + chromium-driver, `make packages`): the browser
tests' one way to start it. The Debian driver is given by path, so Selenium Manager never downloads one."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from selenium import webdriver
from selenium.webdriver.chrome.service import Service

CHROMIUM, CHROMEDRIVER = "/usr/bin/chromium", "/usr/bin/chromedriver"


@contextlib.contextmanager
def headless_chromium(*arguments: str) -> Iterator[webdriver.Chrome]:
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for argument in (
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-dev-shm-usage",
        *arguments,
    ):
        options.add_argument(argument)
    options.add_argument("--window-size=800,800")
    driver = webdriver.Chrome(options=options, service=Service(executable_path=CHROMEDRIVER))
    try:
        yield driver
    finally:
        driver.quit()
