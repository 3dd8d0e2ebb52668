"""A JSON array read an element at a time: a Label Studio export of 200,000 tasks or a cache's list of a
million rows is never one document in memory. Each element is decoded by json's own decoder, so every
value is what json.loads gives (a lone surrogate kept: ijson's fast backend turns it into '?', its
exact one is many times slower).
"""
import json

JSON_SPACE = " \t\n\r"
# The largest element one may take in memory (characters): what a stranger's file cannot exceed.
MAX_ELEMENT_CHARS = 2 ** 26


def json_array_items(text, start="", block=2 ** 20):
    """The elements of the JSON array in a text stream (after `start`, text read from it already), one
    at a time, holding one element's text at a time. ValueError (json.JSONDecodeError where the JSON
    breaks) for anything that is not one array; RecursionError for nesting too deep."""
    decoder, buffer, at, ended = json.JSONDecoder(), start, 0, False

    def more():
        nonlocal buffer, at, ended
        chunk = text.read(block)
        buffer, at, ended = buffer[at:] + chunk, 0, not chunk

    def next_char():
        nonlocal at
        while True:
            while at < len(buffer) and buffer[at] in JSON_SPACE:
                at += 1
            if at < len(buffer) or ended:
                return buffer[at] if at < len(buffer) else ""
            more()
    if next_char() != "[":
        raise ValueError("not a JSON array")
    at += 1
    if next_char() == "]":
        return
    while True:
        next_char()  # the white space before an element
        while True:
            try:
                item, at = decoder.raw_decode(buffer, at)
                break
            except json.JSONDecodeError:
                if ended or len(buffer) - at > MAX_ELEMENT_CHARS:
                    raise
                more()
        yield item
        separator = next_char()
        if separator == "]":
            return
        if separator != ",":
            raise ValueError("a ',' or ']' expected after an element")
        at += 1
