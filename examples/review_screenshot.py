"""A screenshot of a review page (evaluate.py --review) in headless Chromium, for docs/: the first
image corrected to its runner-up class with its chooser, the second confirmed with the keyboard.

    python examples/review_screenshot.py review.html docs/review_page.png
"""
import os
import time
from pathlib import Path

import click


@click.command()
@click.argument("page", type=click.Path(exists=True, dir_okay=False))
@click.argument("png", type=click.Path(dir_okay=False))
@click.option("--width", default=1200, help="Window width in pixels.")
@click.option("--height", default=900, help="Window height in pixels.")
def main(page, png, width, height):
    os.environ["SE_AVOID_STATS"] = "true"  # or Selenium Manager tries the internet
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select
    options = webdriver.ChromeOptions()
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", f"--window-size={width},{height}"):
        options.add_argument(arg)
    options.binary_location = "/usr/bin/chromium"
    driver = webdriver.Chrome(service=Service("/usr/bin/chromedriver"), options=options)
    try:
        driver.get(Path(page).resolve().as_uri())
        cards = driver.find_elements(By.CSS_SELECTOR, ".card")
        runner_up = driver.execute_script("return data.items[0].runner_up")
        Select(cards[0].find_element(By.TAG_NAME, "select")).select_by_value(runner_up)
        cards[1].find_element(By.TAG_NAME, "img").click()
        driver.find_element(By.TAG_NAME, "body").send_keys("y")
        time.sleep(0.5)
        driver.save_screenshot(png)
    finally:
        driver.quit()
    click.echo(f"wrote {png}")


if __name__ == "__main__":
    main()
