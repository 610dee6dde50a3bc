"""The dataset `example-tsv`: the sentence pairs of a TSV file (source TAB target per line) that the user names
with the environment variable MTBENCH_EXAMPLE_TSV. (`mtbench train --data FILE.tsv` reads such a file too; this
dataset shows how a plugin provides a corpus under a name of its own.)"""

import hashlib
import os

from mtbench import Dataset, MtbenchError

TSV_ENV = "MTBENCH_EXAMPLE_TSV"


class TsvDataset(Dataset):
    name = "example-tsv"
    description = f"the TSV file named by {TSV_ENV} (source TAB target per line)"

    @staticmethod
    def path():
        return os.environ.get(TSV_ENV) or None

    def missing_reason(self):
        # mtbench prints this as `Error: dataset 'example-tsv': <reason>` and exits with code 2.
        path = self.path()
        if path is None:
            return f"set {TSV_ENV} to a TSV file of source<TAB>target lines"
        if not os.path.isfile(path):
            return f"{TSV_ENV} names {path}, which is not a file"
        return None

    def fingerprint(self):
        # mtbench caches the pairs under this key: it must change whenever the file's pairs would.
        digest = hashlib.sha256()
        with open(self.path(), "rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                digest.update(chunk)
        return f"{self.name}:{digest.hexdigest()}"

    def read_pairs(self, progress):
        path = self.path()
        with open(path, encoding="utf-8") as f:
            lines = f.read().splitlines()
        for number, line in enumerate(lines, start=1):
            if number % 1000 == 0:
                progress(number, len(lines))
            if not line.strip():
                continue
            if "\t" not in line:
                # A problem the user can fix: one line that says where, without a traceback.
                raise MtbenchError(f"{path}, line {number}: no tab between the source and the target")
            source, target = line.split("\t")[:2]
            yield source, target  # mtbench strips both sides and drops (and counts) pairs with an empty side
        progress(len(lines), len(lines))
