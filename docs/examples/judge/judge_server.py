"""A local OpenAI-compatible judge for trying the `judge` reward on a laptop: it answers
/v1/chat/completions and /v1/completions with a grade from 0 to 10. A stand-in for an LLM — it
grades by whether the response's last number is the reference answer — so the whole path (rubric,
request, reply parsing, retries) runs without a GPU. A real judge is any OpenAI-compatible server,
e.g. `vllm serve <model>`.

    python judge_server.py 8765
"""

import json
import re
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


def grade(prompt: str) -> int:
    """10 when the response's last number is the reference answer, else 0. The response is the text
    between rftflow's ``<response-NONCE>`` delimiters (else after ``Response:``)."""
    reference = re.search(r"Reference answer: (.*)", prompt)
    response = re.search(r"<response-(\w+)>\n(.*)\n</response-\1>", prompt, re.S)
    text = response.group(2) if response else prompt.rpartition("Response: ")[2]
    numbers = re.findall(r"-?\d+", text)
    return 10 if reference and numbers and numbers[-1] == reference.group(1).strip() else 0


class Judge(BaseHTTPRequestHandler):
    def do_POST(self):  # noqa: N802 — http.server's name
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        if self.path.endswith("/chat/completions"):
            text = str(grade(body["messages"][-1]["content"]))
            answer = {"choices": [{"index": 0, "message": {"role": "assistant", "content": text}}]}
        else:
            answer = {"choices": [{"index": 0, "text": str(grade(body["prompt"]))}]}
        data = json.dumps(answer).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):  # quiet
        pass


if __name__ == "__main__":
    ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1]) if len(sys.argv) > 1 else 8765), Judge).serve_forever()
