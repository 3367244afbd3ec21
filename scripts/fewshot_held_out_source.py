"""Dev script: a source predictor trained without the models a few-shot evaluation tests on
(docs/fewshot.md, "An int8 source from another CPU").

    python scripts/fewshot_held_out_source.py --source-data SRC_DS [SRC_DS ...] \
        --new-data NEW_DS --target T --out DIR [--family gbdt] [--shots 10,30]

Where the source device measured the same architectures as the new device (the second and
third VMs' int8 synthetic sets are the same 150 models), a source trained on all of them has
seen the new device's test models. This trains on the source datasets' models minus the
models `latpred evaluate --protocol fewshot --data NEW_DS` (without --train-data) holds out
for testing: its own split (`evaluate.fewshot.pool_and_test` of the models it loads, seed 0),
so the report scores only architectures the source never saw.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from latpred.dataset import Dataset  # noqa: E402
from latpred.dataset_merge import merge_datasets  # noqa: E402
from latpred.evaluate.data import load_eval_set  # noqa: E402
from latpred.evaluate.fewshot import pool_and_test  # noqa: E402
from latpred.predictors import LatencyModel  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--source-data", nargs="+", required=True)
    ap.add_argument("--new-data", required=True)
    ap.add_argument("--target", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--family", default="gbdt")
    ap.add_argument("--shots", default="10,30")
    args = ap.parse_args()
    shots = [int(s) for s in args.shots.split(",")]
    _, test = pool_and_test(load_eval_set(Path(args.new_data), args.target).model_ids, shots)
    with tempfile.TemporaryDirectory() as tmp:
        data = Path(args.source_data[0])
        if len(args.source_data) > 1:
            data = Path(tmp) / "merged"
            merge_datasets([Path(p) for p in args.source_data], data)
        have = Dataset(data).models()
        keep = sorted(set(have[have["target"] == args.target]["model_id"]) - set(test))
        print(f"{len(keep)} source models ({len(set(have['model_id']) & set(test))} of the "
              f"{len(test)} test models left out)")
        LatencyModel.fit(data, args.target, args.family, model_ids=keep).save(args.out)


if __name__ == "__main__":
    main()
