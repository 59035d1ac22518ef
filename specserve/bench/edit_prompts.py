"""The `edit` workload: requests to edit, refactor or annotate a given piece of code (or rewrite given text),
so that a good answer repeats much of its prompt, where prompt lookup drafts well. Written for this project;
mostly Python, a few config and text rewrites, every snippet different."""

from __future__ import annotations

ASK = "Return the complete result in one code block."

LOG_PARSER = """\
def parse_log_line(line, default_level="INFO"):
    parts = line.strip().split(" ", 3)
    if len(parts) < 4:
        return None
    date, time, level, message = parts
    level = level.strip("[]") or default_level
    return {
        "timestamp": f"{date}T{time}",
        "level": level,
        "message": message,
    }


def count_levels(lines):
    counts = {}
    for line in lines:
        entry = parse_log_line(line)
        if entry is not None:
            counts[entry["level"]] = counts.get(entry["level"], 0) + 1
    return counts
"""

WORD_FREQUENCIES = """\
def word_frequencies(text, min_length=3, top=10):
    x = {}
    for word in text.lower().split():
        word = word.strip(".,;:!?\\"'()")
        if len(word) < min_length:
            continue
        x[word] = x.get(word, 0) + 1
    ranked = sorted(x.items(), key=lambda item: (-item[1], item[0]))
    total = sum(x.values())
    result = []
    for word, n in ranked[:top]:
        result.append((word, n, n / total if total else 0.0))
    return result
"""

TOKEN_BUCKET = """\
import time


class TokenBucket:
    def __init__(self, rate, capacity):
        self.rate = rate
        self.capacity = capacity
        self.tokens = capacity
        self.updated = time.monotonic()

    def _refill(self):
        now = time.monotonic()
        self.tokens = min(self.capacity, self.tokens + (now - self.updated) * self.rate)
        self.updated = now

    def try_acquire(self, n=1):
        self._refill()
        if self.tokens >= n:
            self.tokens -= n
            return True
        return False

    def wait_time(self, n=1):
        self._refill()
        missing = n - self.tokens
        return 0.0 if missing <= 0 else missing / self.rate
"""

ACTIVE_EMAILS = """\
def active_user_emails(users, domain=None):
    # users: list of dicts as returned by the accounts API
    emails = []
    for user in users:
        if not user.get("active", False):
            continue
        if user.get("email") is None:
            continue
        if domain is not None and not user["email"].endswith("@" + domain):
            continue
        emails.append(user["email"].lower())
    emails.sort()
    return emails
"""

ORDER_LINE = """\
class OrderLine:
    def __init__(self, sku, quantity, unit_price, discount=0.0):
        self.sku = sku
        self.quantity = quantity
        self.unit_price = unit_price
        self.discount = discount

    def __repr__(self):
        return (
            f"OrderLine(sku={self.sku!r}, quantity={self.quantity!r}, "
            f"unit_price={self.unit_price!r}, discount={self.discount!r})"
        )

    def __eq__(self, other):
        if not isinstance(other, OrderLine):
            return NotImplemented
        return (self.sku, self.quantity, self.unit_price, self.discount) == (
            other.sku, other.quantity, other.unit_price, other.discount
        )

    def total(self):
        return round(self.quantity * self.unit_price * (1 - self.discount), 2)
"""

HANDLE_PAYMENT = """\
def handle_payment(payment, gateway, ledger):
    if payment.amount <= 0:
        raise ValueError("payment amount must be positive")
    if payment.currency not in gateway.supported_currencies:
        payment.status = "rejected"
        return payment
    result = gateway.charge(payment.card_token, payment.amount, payment.currency)
    if result.ok:
        payment.status = "paid"
        ledger.record(payment.order_id, payment.amount, payment.currency)
    elif result.retryable:
        payment.status = "pending"
        payment.attempts += 1
    else:
        payment.status = "failed"
        payment.error = result.message
    return payment
"""

BISECT = """\
def find_first_at_least(values, target):
    # values is sorted ascending; return the index of the first value >= target,
    # or len(values) if every value is smaller.
    lo, hi = 0, len(values) - 1
    while lo < hi:
        mid = (lo + hi) // 2
        if values[mid] < target:
            lo = mid + 1
        else:
            hi = mid
    return lo


def insert_sorted(values, item):
    index = find_first_at_least(values, item)
    values.insert(index, item)
    return index
"""

SERVICE_JSON = """\
{
  "service": {
    "name": "inventory-api",
    "port": 8080,
    "workers": 4,
    "log_level": "info"
  },
  "database": {
    "host": "db.internal",
    "port": 5432,
    "name": "inventory",
    "pool": {"min_size": 2, "max_size": 20, "timeout_seconds": 30}
  },
  "cache": {
    "backend": "redis",
    "url": "redis://cache.internal:6379/0",
    "ttl_seconds": 300
  },
  "features": ["bulk-import", "audit-log", "webhooks"]
}
"""

FRENCH_ADDRESS = """\
def normaliser_adresse(adresse):
    # On enlève les espaces en trop au début et à la fin
    adresse = adresse.strip()
    # Les codes postaux français ont toujours cinq chiffres
    morceaux = adresse.split(",")
    if len(morceaux) < 2:
        # Pas de virgule : on ne peut pas séparer la rue de la ville
        return {"rue": adresse, "code_postal": None, "ville": None}
    rue = morceaux[0].strip()
    reste = morceaux[-1].strip().split(" ", 1)
    # Si le premier mot n'est pas un code postal, on le garde dans la ville
    if len(reste) == 2 and reste[0].isdigit() and len(reste[0]) == 5:
        return {"rue": rue, "code_postal": reste[0], "ville": reste[1].title()}
    return {"rue": rue, "code_postal": None, "ville": morceaux[-1].strip().title()}
"""

LARGE_FILES = """\
import os


def find_large_files(root, min_size_mb=100, extensions=(".log", ".csv")):
    found = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames if not d.startswith(".")]
        for filename in filenames:
            if not filename.endswith(extensions):
                continue
            path = os.path.join(dirpath, filename)
            size = os.path.getsize(path)
            if size >= min_size_mb * 1024 * 1024:
                found.append((os.path.relpath(path, root), size))
    found.sort(key=lambda item: item[1], reverse=True)
    return found


def ensure_archive_dir(root):
    archive = os.path.join(root, "archive")
    if not os.path.isdir(archive):
        os.makedirs(archive)
    return archive
"""

STATUS_CHECK = """\
import requests


def fetch_status(url, timeout=5.0):
    try:
        response = requests.get(url, timeout=timeout)
        return url, response.status_code
    except requests.RequestException as error:
        return url, str(error)


def check_all(urls, timeout=5.0):
    results = {}
    for url in urls:
        url, status = fetch_status(url, timeout)
        results[url] = status
    healthy = [url for url, status in results.items() if status == 200]
    return results, healthy


if __name__ == "__main__":
    report, ok = check_all(["https://example.com", "https://example.org"])
    print(f"{len(ok)}/{len(report)} healthy")
"""

LOAD_SETTINGS = """\
import json


def load_settings(path):
    with open(path, encoding="utf-8") as f:
        data = json.load(f)
    settings = {
        "api_url": data["api_url"].rstrip("/"),
        "api_key": data["api_key"],
        "timeout": float(data.get("timeout", 10)),
        "retries": int(data.get("retries", 3)),
    }
    if settings["timeout"] <= 0:
        settings["timeout"] = 10.0
    return settings
"""

INVOICE_FORMAT = """\
def format_invoice(invoice):
    lines = []
    lines.append("Invoice %s" % invoice["number"])
    lines.append("Customer: {} ({})".format(invoice["customer"], invoice["customer_id"]))
    lines.append("Date: %s" % invoice["date"])
    lines.append("-" * 40)
    for item in invoice["items"]:
        lines.append("%-20s %3d x %8.2f" % (item["name"], item["qty"], item["price"]))
    subtotal = sum(item["qty"] * item["price"] for item in invoice["items"])
    tax = subtotal * invoice["tax_rate"]
    lines.append("-" * 40)
    lines.append("Subtotal: {:>10.2f}".format(subtotal))
    lines.append("Tax ({:.0%}): {:>10.2f}".format(invoice["tax_rate"], tax))
    lines.append("Total: %10.2f" % (subtotal + tax))
    return "\\n".join(lines)
"""

CSV_EXPORTS = """\
import csv


def export_customers(customers, path):
    with open(path, "w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f)
        writer.writerow(["id", "name", "email"])
        for customer in customers:
            writer.writerow([customer.id, customer.name.strip(), customer.email.lower()])


def export_suppliers(suppliers, path):
    with open(path, "w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f)
        writer.writerow(["id", "name", "email"])
        for supplier in suppliers:
            writer.writerow([supplier.id, supplier.name.strip(), supplier.email.lower()])


def export_employees(employees, path):
    with open(path, "w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f)
        writer.writerow(["id", "name", "email"])
        for employee in employees:
            writer.writerow([employee.id, employee.name.strip(), employee.email.lower()])
"""

CART_UNITTEST = """\
import unittest

from shop.cart import Cart


class CartTest(unittest.TestCase):
    def setUp(self):
        self.cart = Cart()

    def test_empty_cart_total_is_zero(self):
        self.assertEqual(self.cart.total(), 0)

    def test_add_item_increases_total(self):
        self.cart.add("apple", price=0.5, quantity=4)
        self.assertAlmostEqual(self.cart.total(), 2.0)

    def test_remove_missing_item_raises(self):
        with self.assertRaises(KeyError):
            self.cart.remove("banana")

    def test_items_are_listed_in_order(self):
        self.cart.add("pear", price=1.0)
        self.cart.add("fig", price=2.0)
        self.assertEqual([item.name for item in self.cart.items()], ["pear", "fig"])


if __name__ == "__main__":
    unittest.main()
"""

BANK_ACCOUNT = """\
class BankAccount:
    def __init__(self, owner, balance=0, overdraft_limit=0):
        self.owner = owner
        self.balance = balance
        self.overdraft_limit = overdraft_limit
        self.history = []

    def deposit(self, amount):
        self.balance += amount
        self.history.append(("deposit", amount))

    def withdraw(self, amount):
        self.balance -= amount
        self.history.append(("withdraw", amount))

    def statement(self):
        lines = [f"Account of {self.owner}"]
        for kind, amount in self.history:
            lines.append(f"{kind:>10} {amount:>10.2f}")
        lines.append(f"{'balance':>10} {self.balance:>10.2f}")
        return "\\n".join(lines)
"""

STOPWATCH = """\
import time


class Stopwatch:
    def __init__(self, name="block", clock=time.perf_counter):
        self.name = name
        self.clock = clock
        self.start_time = None
        self.laps = []

    def start(self):
        self.start_time = self.clock()
        self.laps = []

    def lap(self):
        self.laps.append(self.clock() - self.start_time)

    def stop(self):
        self.lap()
        return self.laps[-1]

    def summary(self):
        if not self.laps:
            return f"{self.name}: not run"
        return f"{self.name}: {self.laps[-1] * 1000:.1f} ms over {len(self.laps)} laps"
"""

RETRIES = """\
import random
import time

import requests


def get_with_retries(url, session=None):
    session = session or requests.Session()
    for attempt in range(5):
        try:
            response = session.get(url, timeout=10)
        except requests.ConnectionError:
            response = None
        if response is not None and response.status_code < 500 and response.status_code != 429:
            return response
        delay = min(30, 0.5 * 2**attempt) + random.uniform(0, 0.25)
        time.sleep(delay)
    raise RuntimeError(f"giving up on {url} after 5 attempts")
"""

JOB_STATUS = """\
STATUS_QUEUED = "queued"
STATUS_RUNNING = "running"
STATUS_DONE = "done"
STATUS_FAILED = "failed"

ALLOWED = {
    STATUS_QUEUED: {STATUS_RUNNING, STATUS_FAILED},
    STATUS_RUNNING: {STATUS_DONE, STATUS_FAILED},
    STATUS_DONE: set(),
    STATUS_FAILED: {STATUS_QUEUED},
}


class Job:
    def __init__(self, job_id):
        self.job_id = job_id
        self.status = STATUS_QUEUED

    def move_to(self, status):
        if status not in ALLOWED[self.status]:
            raise ValueError(f"job {self.job_id}: cannot go from {self.status} to {status}")
        self.status = status

    def is_finished(self):
        return self.status in (STATUS_DONE, STATUS_FAILED)
"""

RESIZE_CLI = """\
import argparse
import logging
import sys

from imgtools import resize_all


def main(argv=None):
    parser = argparse.ArgumentParser(description="Resize every image in a folder.")
    parser.add_argument("source", help="folder with the original images")
    parser.add_argument("target", help="folder for the resized images")
    parser.add_argument("--width", type=int, default=1024, help="maximum width in pixels")
    parser.add_argument("--quality", type=int, default=85, help="JPEG quality, 1-100")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(message)s")
    count = resize_all(args.source, args.target, max_width=args.width, quality=args.quality)
    logging.info("resized %d images", count)
    return 0


if __name__ == "__main__":
    sys.exit(main())
"""

EVENT_BUS = """\
class EventBus:
    def __init__(self, handlers={}):
        self.handlers = handlers

    def subscribe(self, event, handler, tags=[]):
        tags.append(event)
        self.handlers.setdefault(event, []).append((handler, tags))

    def publish(self, event, payload=None):
        delivered = 0
        for handler, tags in self.handlers.get(event, []):
            handler(payload, tags)
            delivered += 1
        return delivered


def collect(event_names, seen=set()):
    for name in event_names:
        seen.add(name)
    return sorted(seen)
"""

SQL_QUERIES = """\
import sqlite3


def find_users(conn, name_prefix, min_age):
    query = "SELECT id, name, age FROM users WHERE name LIKE '%s%%' AND age >= %d" % (name_prefix, min_age)
    return conn.execute(query).fetchall()


def rename_user(conn, user_id, new_name):
    conn.execute(f"UPDATE users SET name = '{new_name}' WHERE id = {user_id}")
    conn.commit()


def delete_inactive(conn, days):
    cutoff = f"date('now', '-{days} days')"
    cursor = conn.execute("DELETE FROM users WHERE last_login < " + cutoff)
    conn.commit()
    return cursor.rowcount


if __name__ == "__main__":
    with sqlite3.connect("users.db") as conn:
        print(find_users(conn, "Al", 30))
"""

RECURSION = """\
def flatten(items):
    result = []
    for item in items:
        if isinstance(item, (list, tuple)):
            result.extend(flatten(item))
        else:
            result.append(item)
    return result


def tree_depth(node):
    if node is None:
        return 0
    children = node.get("children", [])
    if not children:
        return 1
    return 1 + max(tree_depth(child) for child in children)


def count_leaves(node):
    if not node.get("children"):
        return 1
    return sum(count_leaves(child) for child in node["children"])
"""

VECTOR2 = """\
import math


class Vector2:
    def __init__(self, x, y):
        self.x = x
        self.y = y

    def __add__(self, other):
        return Vector2(self.x + other.x, self.y + other.y)

    def __sub__(self, other):
        return Vector2(self.x - other.x, self.y - other.y)

    def __mul__(self, scalar):
        return Vector2(self.x * scalar, self.y * scalar)

    def length(self):
        return math.hypot(self.x, self.y)

    def normalized(self):
        n = self.length()
        if n == 0:
            return Vector2(0, 0)
        return Vector2(self.x / n, self.y / n)

    def dot(self, other):
        return self.x * other.x + self.y * other.y
"""

REPORT_INI = """\
; settings for the nightly report job
[general]
name = nightly-report
timezone = Europe/Berlin
enabled = true

[database]
host = reports-db.internal
port = 5432
user = report_reader
; the password comes from the environment, not from this file
password_env = REPORT_DB_PASSWORD

[schedule]
hour = 2
minute = 30
retry_minutes = 15

[email]
recipients = finance@example.com, ops@example.com
subject = Nightly sales report
attach_csv = yes
"""

USERS_JSON = """\
{
  "users": [
    {
      "id": 101,
      "user_name": "mhoffmann",
      "roles": ["admin", "billing"],
      "profile": {"display_name": "Maria Hoffmann", "locale": "de-DE"}
    },
    {
      "id": 102,
      "user_name": "tokafor",
      "roles": ["support"],
      "profile": {"display_name": "Tobi Okafor", "locale": "en-GB"}
    },
    {
      "id": 103,
      "user_name": "lchen",
      "roles": [],
      "profile": {"display_name": "Li Chen", "locale": "zh-CN"},
      "manager": {"id": 101, "user_name": "mhoffmann"}
    }
  ],
  "generated_at": "2024-05-02T08:00:00Z"
}
"""

ONBOARDING_TEXT = """\
Welcome to the team! This document explain how we work together.

Every morning at 9:30 we have a short stand-up meeting. Each person says what they done yesterday,
what they plan to do today, and weather anything is blocking them. The meeting should not take
more then fifteen minutes.

Code reviews are required for every change. Please request a review from atleast one person who
did not write the code, and try to keep pull requests small so that they are easy to review. If
a review takes longer then a day, feel free to remind the reviewer in the team chat.

We deploy to production on Tuesdays and Thursdays. Dont merge large changes on a Friday afternoon,
because nobody want to debug a broken release over the weekend.

If you have any questions, ask you're buddy or write in the #team-help channel.
"""

ROTATE_BACKUPS = """\
import shutil
from pathlib import Path


def rotate_backups(directory, keep=7):
    backups = sorted(Path(directory).glob("backup-*.tar.gz"))
    print(f"found {len(backups)} backups in {directory}")
    if len(backups) <= keep:
        print("nothing to delete")
        return []
    removed = []
    for path in backups[:-keep]:
        try:
            path.unlink()
            removed.append(path.name)
            print(f"deleted {path.name}")
        except OSError as error:
            print(f"ERROR: could not delete {path.name}: {error}")
    free = shutil.disk_usage(directory).free / 1e9
    print(f"{free:.1f} GB free after cleanup")
    if free < 5:
        print("WARNING: less than 5 GB free")
    return removed
"""

READ_EVENTS = """\
import gzip
import json


def read_events(path, event_type=None, limit=None):
    events = []
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8") as f:
        for line_number, line in enumerate(f, start=1):
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            try:
                event = json.loads(line)
            except json.JSONDecodeError:
                raise ValueError(f"{path}:{line_number}: not valid JSON")
            if event_type is not None and event.get("type") != event_type:
                continue
            events.append(event)
            if limit is not None and len(events) >= limit:
                break
    return events
"""

MESSY_IMPORTS = """\
import sys
from myapp.models import Invoice, Customer
import os
import numpy as np
from datetime import datetime, timedelta
import pandas as pd
import json
from myapp.utils import slugify
import re
from collections import defaultdict


def overdue_report(invoices, today=None):
    today = today or datetime.now()
    by_customer = defaultdict(list)
    for invoice in invoices:
        if invoice.due_date + timedelta(days=30) < today and not invoice.paid:
            by_customer[invoice.customer_id].append(invoice)
    rows = []
    for customer_id, items in by_customer.items():
        rows.append({"customer": customer_id, "count": len(items), "total": sum(i.amount for i in items)})
    frame = pd.DataFrame(rows)
    return frame.sort_values("total", ascending=False)


def report_filename(name):
    return f"{slugify(name)}-{datetime.now():%Y%m%d}.json"
"""

CART_CALC = """\
class Cart:
    def __init__(self, tax_rate=0.2):
        self.tax_rate = tax_rate
        self.items = {}

    def add(self, name, price, quantity=1):
        old_price, old_quantity = self.items.get(name, (price, 0))
        self.items[name] = (price, old_quantity + quantity)

    def calc(self, with_tax=True):
        net = sum(price * quantity for price, quantity in self.items.values())
        return round(net * (1 + self.tax_rate), 2) if with_tax else round(net, 2)

    def summary(self):
        return f"{len(self.items)} items, {self.calc():.2f} incl. tax, {self.calc(False):.2f} net"


def checkout(cart, wallet):
    amount = cart.calc()
    if wallet.balance < amount:
        raise ValueError(f"need {amount:.2f}, have {wallet.balance:.2f}")
    wallet.balance -= amount
    return amount
"""

CI_WORKFLOW = """\
name: ci

on:
  push:
    branches: [main]
  pull_request:

jobs:
  test:
    runs-on: ubuntu-latest
    strategy:
      matrix:
        python-version: ["3.11", "3.12"]
    steps:
      - uses: actions/checkout@v4
      - uses: actions/setup-python@v5
        with:
          python-version: ${{ matrix.python-version }}
          cache: pip
      - name: Install
        run: pip install -e ".[test]"
      - name: Lint
        run: ruff check .
      - name: Test
        run: pytest -q
"""

THREAD_POOL = """\
import threading
from queue import Queue


def download_all(urls, fetch, num_workers=8):
    tasks = Queue()
    results = {}
    lock = threading.Lock()
    for url in urls:
        tasks.put(url)

    def worker():
        while True:
            try:
                url = tasks.get_nowait()
            except Exception:
                return
            try:
                data = fetch(url)
            except Exception as error:
                data = error
            with lock:
                results[url] = data

    threads = [threading.Thread(target=worker) for _ in range(num_workers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return results
"""

FLASK_ARTICLES = """\
from flask import Flask, abort, jsonify, request

from .db import get_session
from .models import Article

app = Flask(__name__)


@app.get("/articles")
def list_articles():
    session = get_session()
    query = session.query(Article).filter(Article.published.is_(True))
    tag = request.args.get("tag")
    if tag:
        query = query.filter(Article.tags.any(name=tag))
    articles = query.order_by(Article.published_at.desc()).all()
    return jsonify([article.to_dict() for article in articles])


@app.get("/articles/<int:article_id>")
def get_article(article_id):
    article = get_session().get(Article, article_id)
    if article is None or not article.published:
        abort(404)
    return jsonify(article.to_dict())
"""

STATISTICS = """\
import statistics


def moving_average(values, window):
    if window <= 0:
        raise ValueError("window must be positive")
    averages = []
    for i in range(len(values) - window + 1):
        averages.append(sum(values[i : i + window]) / window)
    return averages


def outliers(values, threshold=3.0):
    if len(values) < 2:
        return []
    mean = statistics.fmean(values)
    stdev = statistics.stdev(values)
    if stdev == 0:
        return []
    return [(i, v) for i, v in enumerate(values) if abs(v - mean) / stdev > threshold]


def summarize(values):
    return {"min": min(values), "max": max(values), "mean": statistics.fmean(values), "n": len(values)}
"""

RPN_DISPATCH = """\
def apply_operation(stack, op):
    if op == "+":
        b, a = stack.pop(), stack.pop()
        stack.append(a + b)
    elif op == "-":
        b, a = stack.pop(), stack.pop()
        stack.append(a - b)
    elif op == "*":
        b, a = stack.pop(), stack.pop()
        stack.append(a * b)
    elif op == "/":
        b, a = stack.pop(), stack.pop()
        if b == 0:
            raise ZeroDivisionError("division by zero in expression")
        stack.append(a / b)
    elif op == "dup":
        stack.append(stack[-1])
    elif op == "swap":
        stack[-1], stack[-2] = stack[-2], stack[-1]
    else:
        stack.append(float(op))
    return stack
"""

# (instruction, language of the code block, snippet); every snippet is 10 to 40 lines
EDITS: list[tuple[str, str, str]] = [
    ("Add type hints to these functions.", "python", LOG_PARSER),
    ("Rename the variable `x` to `count` throughout this function.", "python", WORD_FREQUENCIES),
    ("Add a docstring to the class and to each method.", "python", TOKEN_BUCKET),
    ("Convert the loop into a list comprehension and return the whole function.", "python", ACTIVE_EMAILS),
    ("Rewrite this class as a dataclass, keeping its behaviour.", "python", ORDER_LINE),
    ("Add a logging call to each branch of this function, using a module-level logger.", "python", HANDLE_PAYMENT),
    ("Fix the bug in this binary search and return the corrected function.", "python", BISECT),
    ("Convert this JSON to YAML.", "json", SERVICE_JSON),
    ("Translate the comments in this code into English, keeping the code exactly as it is.", "python", FRENCH_ADDRESS),
    ("Rewrite this code to use pathlib instead of os.path, os.walk and os.makedirs.", "python", LARGE_FILES),
    ("Convert this code to asyncio, using aiohttp instead of requests.", "python", STATUS_CHECK),
    (
        "Add error handling: raise ValueError with a clear message for a missing file, bad JSON or a missing key.",
        "python",
        LOAD_SETTINGS,
    ),
    ("Rewrite all the string formatting in this code as f-strings.", "python", INVOICE_FORMAT),
    ("Extract the repeated code into a helper function and return the whole module.", "python", CSV_EXPORTS),
    ("Convert these unittest tests into plain pytest test functions.", "python", CART_UNITTEST),
    (
        "Validate the arguments of __init__, deposit and withdraw, raising ValueError with a helpful message.",
        "python",
        BANK_ACCOUNT,
    ),
    (
        "Make this class usable as a context manager (`with Stopwatch() as sw:`) without changing its other methods.",
        "python",
        STOPWATCH,
    ),
    ("Replace the magic numbers in this code with named module-level constants.", "python", RETRIES),
    ("Replace the string status constants with an Enum and update the code that uses them.", "python", JOB_STATUS),
    (
        "Add a `--verbose` flag that sets the log level to DEBUG, and return the whole script.",
        "python",
        RESIZE_CLI,
    ),
    ("Fix the mutable default argument bugs in this code and return the corrected code.", "python", EVENT_BUS),
    (
        "Rewrite the queries in this code to use parameters instead of string formatting, to prevent SQL injection.",
        "python",
        SQL_QUERIES,
    ),
    ("Rewrite these recursive functions iteratively, with an explicit stack.", "python", RECURSION),
    ("Add `__slots__`, a `__repr__` and type hints to this class.", "python", VECTOR2),
    ("Convert this INI configuration to TOML, keeping every section, key and comment.", "ini", REPORT_INI),
    (
        "Rename the key `user_name` to `username` everywhere in this JSON and leave everything else unchanged.",
        "json",
        USERS_JSON,
    ),
    (
        "Correct the spelling and grammar mistakes in this text; keep everything else, line breaks included.",
        "text",
        ONBOARDING_TEXT,
    ),
    ("Replace the print statements in this code with logging calls at suitable levels.", "python", ROTATE_BACKUPS),
    (
        "Turn this function into a generator that yields each event instead of building a list.",
        "python",
        READ_EVENTS,
    ),
    (
        "Sort the imports (standard library, third-party, local), remove the unused ones, and return the whole module.",
        "python",
        MESSY_IMPORTS,
    ),
    ("Rename the method `calc` to `total_price` and update every place that calls it.", "python", CART_CALC),
    (
        "Add a step that runs mypy after the test step to this GitHub Actions workflow, and return the whole workflow.",
        "yaml",
        CI_WORKFLOW,
    ),
    (
        "Rewrite this code to use concurrent.futures.ThreadPoolExecutor instead of managing threads by hand.",
        "python",
        THREAD_POOL,
    ),
    (
        "Add `limit` and `offset` query parameters, with defaults and bounds, to the list route of this Flask app.",
        "python",
        FLASK_ARTICLES,
    ),
    ("Add type hints and a Google-style docstring to each function.", "python", STATISTICS),
    ("Replace the if/elif chain with a dictionary dispatch and return the whole function.", "python", RPN_DISPATCH),
]


def edit_prompts() -> list[str]:
    """One chat prompt per edit: the instruction, the request for the whole result, then the code."""
    return [f"{instruction} {ASK}\n\n```{language}\n{snippet}```" for instruction, language, snippet in EDITS]
