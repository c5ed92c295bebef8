"""The chat answers of a source for the prompts the frontier reads (the first 48 of the calibration split:
`--kv-bytes` selection; every held-out one: the table), in the answer-file format load_chat reads, written
where chat_data.answers_file looks (the user cache, under the source's fingerprint): transformers, greedy, float32."""
import json, sys
from pathlib import Path
from latentkv.sources import chat_data as cd
from latentkv.user_cache import cache_root, content_hash
src = Path(sys.argv[1])
prompts = cd.load_prompts()
need = [r for r in prompts if r["split"] == "heldout"] + [r for r in prompts if r["split"] == "calib"][:48]
fp = content_hash(src)
out = cache_root() / "chat" / f"answers-{fp[:24]}-{cd.MAX_NEW_TOKENS}.jsonl"
answers = cd.transformers_answers(src, need, cd.MAX_NEW_TOKENS, 32)
header = {"format": cd.FORMAT, "source": src.name, "fingerprint": fp, "prompts": cd.prompts_digest(),
          "max_new_tokens": cd.MAX_NEW_TOKENS, "dtype": "float32", "decoding": "greedy", "generator": "transformers",
          "subset": "first 48 calib + all heldout"}
order = {r["id"]: i for i, r in enumerate(prompts)}
rows = sorted(zip(need, answers), key=lambda x: order[x[0]["id"]])
out.parent.mkdir(parents=True, exist_ok=True)
with open(out, "w", encoding="utf-8") as f:
    f.write(json.dumps(header) + "\n")
    for r, (text, ids, finished) in rows:
        f.write(json.dumps({"id": r["id"], "category": r["category"], "split": r["split"], "prompt": r["prompt"],
                            "answer": text, "answer_ids": ids, "finished": finished}, ensure_ascii=False) + "\n")
print("wrote", out, len(rows))
