"""Run by gcloud's own bundled Python: parse gcloud command lines with
gcloud's argument parser (calliope), without running them.

    <sdk>/platform/bundledpythonunix/bin/python3 gcloud_parse.py <sdk_root> < lines.jsonl

Each input line is a JSON list (argv without "gcloud"); each output line is
JSON {"argv": [...], "ok": bool, "error": "..."}. This relies on gcloud
internals (calliope's parser), so callers keep a known-good and a known-bad
canary among the lines and fall back to the CLI when they misbehave.
Standard library only: it runs outside the project's virtualenv.

The lines are read whole before any is parsed, and each is parsed with an
empty stdin: a flag whose value is read as it is parsed reads ``-`` as
stdin (gcloud's FileContents: a node pool's ``--system-config-from-file=-``,
playbooks/cloud/node_shutdown.py), which would else swallow the lines left.
"""
import io
import json
import os
import sys
import tempfile


def main():
    sdk = sys.argv[1]
    sys.path.insert(0, os.path.join(sdk, "lib"))
    sys.path.insert(0, os.path.join(sdk, "lib", "third_party"))
    from googlecloudsdk import gcloud_main

    parser = gcloud_main.CreateCLI([])._CLI__parser
    out = sys.stdout
    saved = os.dup(2)
    lines = sys.stdin.read().splitlines()
    sys.stdin = io.StringIO("")
    for line in lines:
        if not line.strip():
            continue
        argv = json.loads(line)
        result = {"argv": argv, "ok": True, "error": ""}
        with tempfile.TemporaryFile(mode="w+") as err:
            os.dup2(err.fileno(), 2)
            try:
                args = parser.parse_args(argv)
                if getattr(args, "CONCEPT_ARGS", None) is not None:
                    args.CONCEPT_ARGS.ParseConcepts()
            except SystemExit:
                result["ok"] = False
            except Exception as e:  # a concept (resource argument) error
                result["ok"] = False
                result["error"] = f"{type(e).__name__}: {e}"
            finally:
                sys.stderr.flush()
                os.dup2(saved, 2)
            err.seek(0)
            text = [ln for ln in err.read().splitlines() if ln.startswith("ERROR:")]
            if not result["ok"] and not result["error"]:
                result["error"] = text[0] if text else "rejected"
        out.write(json.dumps(result) + "\n")
        out.flush()


if __name__ == "__main__":
    main()
