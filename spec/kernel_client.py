"""Drives `moongrad --kernel` through jupyter_client, as Jupyter does
(spec/37-kernel_spec.lua runs it with Debian's /usr/bin/python3).

    kernel_client.py SCENARIO

installs the kernelspec with `moongrad --install-kernel --user` into a
temporary JUPYTER_DATA_DIR (the user's own Jupyter folders are never
touched), starts the kernel with KernelManager, runs the scenario's checks
and prints `ok SCENARIO`; a failed check raises (exit status 1, with why).
$MOONGRAD_BIN names the binary (build/moongrad).
"""
import json
import os
import subprocess
import sys
import tempfile
import time

import zmq
from jupyter_client import KernelManager
from jupyter_client.session import Session

BIN = os.path.abspath(os.environ.get("MOONGRAD_BIN", "build/moongrad"))
TIMEOUT = 60


def check(cond, what, *detail):
    if not cond:
        raise AssertionError(what + ("" if not detail else ": " + " ".join(repr(d) for d in detail)))


class Kernel:
    """A kernel started from the installed kernelspec, and a client."""

    def __init__(self, tmp):
        self.tmp = tmp
        self.log_path = os.path.join(tmp, "kernel.log")
        self.log = open(self.log_path, "w")
        self.km = KernelManager(kernel_name="moongrad")
        self.km.start_kernel(stderr=self.log)
        self.kc = self.km.client()
        self.kc.start_channels()
        self.kc.wait_for_ready(timeout=TIMEOUT)

    def run(self, code, **kw):
        """executes code; returns (reply content, iopub messages for it)"""
        msg_id = self.kc.execute(code, **kw)
        return self.collect(msg_id)

    def started(self, msg_id):
        """waits until the kernel runs msg_id (its execute_input); returns the messages so far"""
        out = []
        while not out or out[-1]["msg_type"] != "execute_input":
            msg = self.kc.get_iopub_msg(timeout=TIMEOUT)
            if msg["parent_header"].get("msg_id") == msg_id:
                out.append(msg)
        time.sleep(0.5)
        return out

    def collect(self, msg_id, shell=True, out=None):
        out = out or []
        while True:
            msg = self.kc.get_iopub_msg(timeout=TIMEOUT)
            if msg["parent_header"].get("msg_id") != msg_id:
                continue
            if msg["msg_type"] == "status" and msg["content"]["execution_state"] == "idle":
                break
            out.append(msg)
        reply = None
        if shell:
            while True:
                r = self.kc.get_shell_msg(timeout=TIMEOUT)
                if r["parent_header"].get("msg_id") == msg_id:
                    reply = r["content"]
                    break
        return reply, out

    def stop(self):
        """a clean shutdown: status 0 (under make asan: no leak, no sanitizer report)"""
        proc = self.km.provisioner.process
        self.kc.stop_channels()
        self.km.shutdown_kernel(now=False)
        self.log.close()
        check(proc.wait(timeout=30) == 0, "the kernel ended with status 0", proc.returncode, self.log_text()[-3000:])

    def log_text(self):
        if not self.log.closed:
            self.log.flush()
        with open(self.log_path) as f:
            return f.read()


def of_type(msgs, t):
    return [m["content"] for m in msgs if m["msg_type"] == t]


def stream(msgs, name):
    return "".join(c["text"] for c in of_type(msgs, "stream") if c["name"] == name)


def result(msgs):
    r = of_type(msgs, "execute_result")
    check(len(r) == 1, "one execute_result", [m["msg_type"] for m in msgs])
    return r[0]["data"]


# {========================== scenarios ==========================

def execute(k):
    reply, msgs = k.run('print("hello", 42) io.write("no newline") io.stderr:write("careful\\n")\n'
                        'x = mg.tensor({{1, 2}, {3, 4}})\nreturn x:sum()')
    check(reply["status"] == "ok", "status ok", reply)
    check(reply["execution_count"] == 1, "execution_count 1", reply)
    check(stream(msgs, "stdout") == "hello\t42\nno newline", "stdout as stream", stream(msgs, "stdout"))
    check(stream(msgs, "stderr") == "careful\n", "stderr as stream", stream(msgs, "stderr"))
    types = [m["msg_type"] for m in msgs]
    check(types[0] == "status" and types[1] == "execute_input", "busy, then execute_input", types)
    check(types.index("execute_result") > max(i for i, t in enumerate(types) if t == "stream"),
          "the result after the output", types)
    check(result(msgs)["text/plain"].startswith("10.0"), "the value of the last expression", result(msgs))
    _, msgs = k.run("x")                      # an expression: its value, as the REPL shows it
    data = result(msgs)
    check("3.0, 4.0" in data["text/plain"], "a tensor as text", data)
    check("<table" in data["text/html"] and "<td" in data["text/html"], "a small tensor as an HTML table", data)
    _, msgs = k.run("return 1, 'two', {3}")
    check(result(msgs)["text/plain"] == '1\ttwo\t{3}', "several values as the REPL prints them", result(msgs))
    _, msgs = k.run("mg.memory.stats()")
    check("<th" in result(msgs)["text/html"] and "peak_bytes" in result(msgs)["text/html"],
          "memory.stats() as a table", result(msgs))
    _, msgs = k.run("local big = mg.zeros({100, 100}) return big")
    check("text/html" not in result(msgs), "a big tensor as text only", result(msgs).keys())
    reply, msgs = k.run("y = 1", silent=True)
    check(reply["status"] == "ok" and not [m for m in msgs if m["msg_type"] != "status"], "silent: no output", msgs)
    reply, msgs = k.run("local a = 1")
    check(reply["status"] == "ok" and not of_type(msgs, "execute_result"), "a statement: no result", msgs)
    check(reply["execution_count"] == 7, "counts the stored executions", reply)


def rich(k):
    reply, msgs = k.run("mg.plot({3, 1, 2}, {title = 'loss'})")
    check(reply["status"] == "ok", "plot ran", reply)
    shown = of_type(msgs, "display_data")
    check(len(shown) == 1 and "image/png" in shown[0]["data"], "the plot as image/png", msgs)
    import base64
    png = base64.b64decode(shown[0]["data"]["image/png"])
    check(png[:8] == b"\x89PNG\r\n\x1a\n", "a PNG")
    check(not of_type(msgs, "execute_result"), "plot returns nothing in a notebook", msgs)
    reply, msgs = k.run(
        "mg.random.seed(1); local X = mg.random.normal({256, 4}); local Y = mg.sum(X, 2, true)\n"
        "local m = mg.nn.Sequential{mg.nn.Dense(1)}\n"
        "m:compile{optimizer = mg.optim.SGD{learning_rate = 0.01}, loss = 'mse'}\n"
        "h = m:fit(X, Y, {epochs = 2, batch_size = 8})")
    check(reply["status"] == "ok", "fit ran", reply)
    shown, updates = of_type(msgs, "display_data"), of_type(msgs, "update_display_data")
    check(len(shown) == 2, "one display per epoch's bar", [m["msg_type"] for m in msgs])
    ids = {d["transient"]["display_id"] for d in shown}
    check(len(ids) == 2 and all(u["transient"]["display_id"] in ids for u in updates), "updates of those", updates)
    last = updates[-1]["data"]["text/plain"] if updates else shown[-1]["data"]["text/plain"]
    check("32/32" in last and "loss:" in last, "the final line in place", last)
    check("32/32" not in stream(msgs, "stdout"), "no bar lines in the stream", stream(msgs, "stdout"))
    check("Epoch 1/2" in stream(msgs, "stdout"), "the epoch lines as text", stream(msgs, "stdout"))
    reply, msgs = k.run("h:plot()")
    check(any("image/png" in d["data"] for d in of_type(msgs, "display_data")), "History:plot inline", msgs)


def complete(k):
    k.run("losses = {1, 2}")
    msg_id = k.kc.complete("z = mg.matm", 11)
    r = k.kc.get_shell_msg(timeout=TIMEOUT)["content"]
    check(r["status"] == "ok" and "mg.matmul" in r["matches"], "mg.matm completes", r)
    check(r["cursor_start"] == 4 and r["cursor_end"] == 11, "the word's span", r)
    k.kc.complete("print(loss", 10)
    r = k.kc.get_shell_msg(timeout=TIMEOUT)["content"]
    check(r["matches"] == ["losses"], "a global completes", r)
    k.kc.complete("é = mg.nn.Den", 13)                # cursor in code points, not bytes
    r = k.kc.get_shell_msg(timeout=TIMEOUT)["content"]
    check("mg.nn.Dense" in r["matches"] and r["cursor_start"] == 4, "code points", r)
    for pos in (-1, 12, -1e300, 1e300):               # outside the code: its end
        k.kc.complete("z = mg.matm", pos)
        r = k.kc.get_shell_msg(timeout=TIMEOUT)["content"]
        check(r["status"] == "ok" and "mg.matmul" in r["matches"] and r["cursor_end"] == 11,
              "cursor_pos %r is taken for the end" % pos, r)
    k.kc.inspect("mg.matmul(a, b)", pos)
    r = k.kc.get_shell_msg(timeout=TIMEOUT)["content"]
    check(r["status"] == "ok" and not r["found"], "inspect with cursor_pos 1e300: at the end, after ')'", r)
    k.kc.inspect("mg.matmul(a, b)", 9)
    r = k.kc.get_shell_msg(timeout=TIMEOUT)["content"]
    check(r["found"] and "mg.matmul(a, b)" in r["data"]["text/plain"] and "matrix product" in r["data"]["text/plain"],
          "inspect: signature and description", r)
    k.kc.inspect("mg.nn.Dense(", 12)
    r = k.kc.get_shell_msg(timeout=TIMEOUT)["content"]
    check(r["found"] and "nn.Dense" in r["data"]["text/plain"], "inspect a layer after its '('", r)
    k.kc.inspect("nosuchname", 3)
    r = k.kc.get_shell_msg(timeout=TIMEOUT)["content"]
    check(r["status"] == "ok" and not r["found"], "inspect an unknown name", r)
    for code, want in [("for i = 1, 3 do", "incomplete"), ("x = {1,\n2", "incomplete"), ("x = 1", "complete"),
                       ("1 + 1", "complete"), ("x = = 1", "invalid")]:
        k.kc.is_complete(code)
        r = k.kc.get_shell_msg(timeout=TIMEOUT)["content"]
        check(r["status"] == want, "is_complete " + code, r)


def error(k):
    reply, msgs = k.run("local function f() error('boom') end\nf()\nprint('not reached')")
    check(reply["status"] == "error" and reply["ename"] == "LuaError", "an error reply", reply)
    check("boom" in reply["evalue"] and "In[1]:1:" in reply["evalue"], "the message, where", reply)
    errs = of_type(msgs, "error")
    check(len(errs) == 1 and "stack traceback:" in errs[0]["traceback"], "the error on iopub with its traceback", errs)
    check(any("in local 'f'" in line or "in function 'f'" in line or "in upvalue 'f'" in line
              for line in errs[0]["traceback"]), "the traceback names f", errs[0]["traceback"])
    reply, msgs = k.run("x = = 1")
    check(reply["status"] == "error" and reply["ename"] == "SyntaxError", "a syntax error", reply)
    reply, msgs = k.run("mg.matmul(mg.ones({2, 3}), mg.ones({2, 3}))")
    check(reply["status"] == "error" and "matmul" in reply["evalue"], "the library's error", reply)
    reply, _ = k.run("return 40 + 2")
    check(reply["status"] == "ok", "the kernel goes on", reply)
    # "Run All": the executes queued behind a failing one are aborted, not run
    first = k.kc.execute("local t = mg.clock() while mg.clock() - t < 0.5 do end error('stop here')")
    second = k.kc.execute("ran = true")
    reply, _ = k.collect(first)
    check(reply["status"] == "error", "the first fails", reply)
    reply, _ = k.collect(second)
    check(reply["status"] == "aborted", "the queued one is aborted", reply)
    _, msgs = k.run("return ran == nil")
    check(result(msgs)["text/plain"] == "true", "and did not run", msgs)
    _, msgs = k.run("io.write('bad \\255\\0 bytes') return '\\200'")
    check(stream(msgs, "stdout") == "bad \ufffd\ufffd bytes", "invalid UTF-8 in a stream, replaced", msgs)
    check(result(msgs)["text/plain"] == "\ufffd", "and in a result", msgs)
    _, msgs = k.run("for i = 1, 100000 do print(i) end")
    check(stream(msgs, "stdout") == "".join("%d\n" % i for i in range(1, 100001)), "10^5 lines, all")
    check(len(of_type(msgs, "stream")) < 1000, "gathered into few messages", len(of_type(msgs, "stream")))
    _, msgs = k.run("print(('x'):rep(300000))")
    check(stream(msgs, "stdout") == "x" * 300000 + "\n", "a long output, whole", len(stream(msgs, "stdout")))


def interrupt(k):
    k.run("state = 41")
    msg_id = k.kc.execute("local n = 0 while true do n = n + 1 end")
    before = k.started(msg_id)
    k.km.interrupt_kernel()                      # SIGINT, as the notebook's stop button
    reply, msgs = k.collect(msg_id, out=before)
    check(reply["status"] == "error" and reply["ename"] == "Interrupted", "the loop stopped with an error", reply)
    check("interrupted" in reply["evalue"], "says so", reply)
    msg_id = k.kc.execute("local x = mg.ones({64, 64}) for i = 1, 1e9 do x = mg.matmul(x, x) / 64 end")
    k.started(msg_id)
    k.km.interrupt_kernel()
    reply, _ = k.collect(msg_id)
    check(reply["status"] == "error" and reply["ename"] == "Interrupted", "a loop of ops stopped", reply)
    reply, msgs = k.run("return state + 1")
    check(reply["status"] == "ok" and result(msgs)["text/plain"] == "42", "the state is kept", reply, msgs)
    # interrupt_request on the control channel stops code as well
    msg_id = k.kc.execute("while true do end")
    k.started(msg_id)
    req = k.kc.session.msg("interrupt_request", {})
    k.kc.control_channel.send(req)
    r = k.kc.get_control_msg(timeout=TIMEOUT)
    check(r["msg_type"] == "interrupt_reply", "interrupt_reply", r["msg_type"])
    reply, _ = k.collect(msg_id)
    check(reply["status"] == "error" and reply["ename"] == "Interrupted", "interrupt_request stops it", reply)
    reply, msgs = k.run("return state")
    check(result(msgs)["text/plain"] == "41", "and the state is kept", msgs)


def stdin(k):
    msg_id = k.kc.execute("name = io.read() local n = io.read('n') return name, n + 1", allow_stdin=True)
    for value in ("moon", "41"):
        req = k.kc.get_stdin_msg(timeout=TIMEOUT)
        check(req["msg_type"] == "input_request" and req["parent_header"]["msg_id"] == msg_id, "input_request", req)
        k.kc.input(value)
    reply, msgs = k.collect(msg_id)
    check(reply["status"] == "ok" and result(msgs)["text/plain"] == "moon\t42", "io.read asks the notebook", reply, msgs)
    reply, msgs = k.run("return io.read()", allow_stdin=False)
    check(result(msgs)["text/plain"] == "nil", "no input allowed (nbconvert): end of input", msgs)
    msg_id = k.kc.execute("return io.read()", allow_stdin=True)
    k.kc.get_stdin_msg(timeout=TIMEOUT)
    k.km.interrupt_kernel()
    reply, _ = k.collect(msg_id)
    check(reply["status"] == "error" and reply["ename"] == "Interrupted", "the wait for input is interruptible", reply)
    reply, msgs = k.run("return name")
    check(result(msgs)["text/plain"] == "moon", "the state is kept", msgs)


def history(k):
    for code in ["a = 1", "b = 2", "return a + b"]:
        k.run(code)
    k.kc.history(hist_access_type="tail", n=2)
    r = k.kc.get_shell_msg(timeout=TIMEOUT)["content"]
    check([h[1:] for h in r["history"]] == [[2, "b = 2"], [3, "return a + b"]], "the last two", r)
    k.kc.history(hist_access_type="range")
    r = k.kc.get_shell_msg(timeout=TIMEOUT)["content"]
    check(len(r["history"]) == 3, "all three", r)
    # n is taken only when 0 <= n < the count; else all of it, as IPython's
    # LIMIT n (a negative one is no limit): -1e300 once spun for half a minute
    for n, want in [(-1, 3), (-1e300, 3), (1e300, 3), (3, 3), (2.5, 2), (0, 0), ("2", 3), (None, 3)]:
        k.kc.history(hist_access_type="tail", n=n)
        r = k.kc.get_shell_msg(timeout=TIMEOUT)["content"]
        check(r["status"] == "ok" and len(r["history"]) == want, "tail with n = %r: %d" % (n, want), r)
        check(r["history"] == [[1, i, c] for i, c in enumerate(["a = 1", "b = 2", "return a + b"], 1)][3 - want:],
              "the last %d in order" % want, r)
    reply, _ = k.run("return 1")
    check(reply["status"] == "ok", "the kernel goes on", reply)


def restart(k):
    k.run("kept = 7")
    k.km.restart_kernel(now=False)
    k.kc.wait_for_ready(timeout=TIMEOUT)
    reply, msgs = k.run("return kept == nil, 1 + 1")
    check(reply["status"] == "ok" and result(msgs)["text/plain"] == "true\t2", "a fresh state", reply, msgs)
    check(reply["execution_count"] == 1, "counting from 1 again", reply)


def listening(port):
    """the addresses of the TCP sockets listening on port (hex, as /proc/net/tcp has them)"""
    found = []
    for name in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = open(name).read().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            f = line.split()
            addr, p = f[1].split(":")
            if int(p, 16) == port and f[3] == "0A":
                found.append(addr)
    return found


def forged(k):
    info = k.km.get_connection_info()
    for name in ("shell_port", "iopub_port", "stdin_port", "control_port", "hb_port"):
        check(listening(info[name]) == ["0100007F"], "%s bound to 127.0.0.1 only" % name, listening(info[name]))
    target = os.path.join(k.tmp, "forged")
    code = 'io.open(%s, "w"):write("ran"):close()' % json.dumps(target)
    counter = os.path.join(k.tmp, "runs")
    append = 'io.open(%s, "a"):write("x"):close()' % json.dumps(counter)
    info = k.km.get_connection_info()
    ctx = zmq.Context.instance()
    sock = ctx.socket(zmq.DEALER)
    sock.connect("%s://%s:%d" % (info["transport"], info["ip"], info["shell_port"]))
    content = {"code": code, "silent": False, "store_history": True, "user_expressions": {}, "allow_stdin": False}
    Session(key=b"not the key").send(sock, "execute_request", content)      # signed with another key
    Session(key=b"").send(sock, "execute_request", content)                 # not signed
    bad = Session(key=info["key"])
    msg = bad.msg("execute_request", content)
    parts = bad.serialize(msg)                                              # the right key, then changed
    i = parts.index(b"<IDS|MSG>")
    parts[i + 5] = parts[i + 5].replace(b"ran", b"RAN")
    sock.send_multipart(parts)
    good = Session(key=info["key"])                                        # a replay of a signed message
    parts = good.serialize(good.msg("execute_request", dict(content, code=append)))
    sock.send_multipart(parts)
    sock.send_multipart(parts)
    time.sleep(1.0)
    replies = []
    while sock.poll(100):
        replies.append(good.deserialize(good.feed_identities(sock.recv_multipart())[1]))
    check([r["content"]["status"] for r in replies] == ["ok"], "one reply: the first time", replies)
    reply, _ = k.run("return 1")
    check(reply["status"] == "ok", "the kernel still answers", reply)
    check(not os.path.exists(target), "nothing ran")
    check(open(counter).read() == "x", "the replay did not run", open(counter).read())
    log = k.log_text()
    check(log.count("dropped a message") == 4, "each logged", log)
    check("wrong signature" in log and "not signed" in log and "a replay" in log, "saying why", log)
    sock.close(0)


def raw_shell(k):
    """a DEALER of our own on the shell port, a Session with the key, and a reader of its replies"""
    info = k.km.get_connection_info()
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.connect("%s://%s:%d" % (info["transport"], info["ip"], info["shell_port"]))
    session = Session(key=info["key"])

    def reply():
        check(sock.poll(TIMEOUT * 1000), "a reply")
        return session.deserialize(session.feed_identities(sock.recv_multipart())[1])
    return sock, session, reply


def execute_content(code):
    return {"code": code, "silent": False, "store_history": True, "user_expressions": {}, "allow_stdin": False}


def replays(k):
    """a captured signed message is refused however many came after it (it was the last 4096 only)"""
    sock, session, reply = raw_shell(k)
    counter = os.path.join(k.tmp, "runs")
    first = session.serialize(session.msg("execute_request", execute_content(
        'io.open(%s, "a"):write("x"):close()' % json.dumps(counter))))
    sock.send_multipart(first)
    r = reply()
    check(r["msg_type"] == "execute_reply" and r["content"]["status"] == "ok", "it runs once", r)
    for _ in range(4200):                                                  # signed, each its own
        sock.send_multipart(session.serialize(session.msg("kernel_info_request", {})))
        r = reply()
        check(r["msg_type"] == "kernel_info_reply", "kernel_info_reply", r["msg_type"])
    sock.send_multipart(first)                                             # the replay
    sock.send_multipart(session.serialize(session.msg("kernel_info_request", {})))
    r = reply()
    check(r["msg_type"] == "kernel_info_reply", "no reply to the replay: the next message's comes first", r)
    check(open(counter).read() == "x", "the replay did not run", open(counter).read())
    log = k.log_text()
    check(log.count("a replay (its signature was seen before)") == 1, "logged", log[-2000:])
    sock.close(0)


def oversized(k):
    """a frame above 16 MiB (MG_KMAXFRAME) is refused by ZeroMQ before it is stored; one below is run"""
    sock, session, reply = raw_shell(k)
    for size, runs in ((17 << 20, False), (15 << 20, True)):
        target = os.path.join(k.tmp, "ran-%d" % size)
        code = 'io.open(%s, "w"):write("ran"):close()\n--' % json.dumps(target)
        parts = session.serialize(session.msg("execute_request", execute_content(code + "x" * (size - len(code)))))
        check(len(parts[-1]) > size if not runs else len(parts[-1]) < 16 << 20, "the content's size", len(parts[-1]))
        sock.send_multipart(parts)                                         # correctly signed
        sock.send_multipart(session.serialize(session.msg("kernel_info_request", {})))
        r = reply()
        if runs:
            check(r["msg_type"] == "execute_reply" and r["content"]["status"] == "ok", "15 MiB runs", r["content"])
            r = reply()
        check(r["msg_type"] == "kernel_info_reply", "the next message is answered", r["msg_type"])
        check(os.path.exists(target) == runs, "ran" if runs else "did not run", size)
    reply_, _ = k.run("return 1")
    check(reply_["status"] == "ok", "the kernel still answers", reply_)
    sock.close(0)


def shutdown(k):
    k.kc.shutdown()
    r = k.kc.get_control_msg(timeout=TIMEOUT)
    check(r["msg_type"] == "shutdown_reply", "shutdown_reply", r["msg_type"])
    for _ in range(100):
        if not k.km.is_alive():
            break
        time.sleep(0.1)
    check(not k.km.is_alive(), "the kernel ended")
    check(k.km.provisioner.process.wait(timeout=5) == 0, "with status 0")

# }================================================================


def main():
    scenario = globals()[sys.argv[1]]
    with tempfile.TemporaryDirectory() as tmp:
        env = dict(os.environ, JUPYTER_DATA_DIR=os.path.join(tmp, "data"))
        out = subprocess.run([BIN, "--install-kernel", "--user"], env=env, capture_output=True, text=True)
        check(out.returncode == 0, "install-kernel", out.stdout, out.stderr)
        spec = json.load(open(os.path.join(tmp, "data", "kernels", "moongrad", "kernel.json")))
        check(spec["argv"] == [os.path.realpath(BIN), "--kernel", "{connection_file}"], "kernel.json's argv", spec)
        check(spec["display_name"] == "moongrad (Lua 5.4)" and spec["language"] == "lua", "kernel.json", spec)
        os.environ.update(JUPYTER_DATA_DIR=env["JUPYTER_DATA_DIR"], JUPYTER_PATH=env["JUPYTER_DATA_DIR"],
                          JUPYTER_RUNTIME_DIR=os.path.join(tmp, "runtime"), JUPYTER_CONFIG_DIR=os.path.join(tmp, "config"))
        k = Kernel(tmp)
        try:
            scenario(k)
        finally:
            if k.km.is_alive():
                k.stop()
    print("ok", sys.argv[1])


if __name__ == "__main__":
    main()
