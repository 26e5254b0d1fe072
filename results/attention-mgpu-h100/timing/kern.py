"""Per-kernel medians over the last N calls of an nsys sqlite. usage: kern.py DB N"""
import sqlite3, sys, collections, statistics as S
db = sqlite3.connect(sys.argv[1]); n = int(sys.argv[2])
names = dict(db.execute("select id, value from StringIds"))
ev = [(s, e, "K " + names[k][:90]) for s, e, k in db.execute("select start, end, shortName from CUPTI_ACTIVITY_KIND_KERNEL")]
for tab, lab in (("CUPTI_ACTIVITY_KIND_MEMCPY", "memcpy"), ("CUPTI_ACTIVITY_KIND_MEMSET", "memset")):
    try:
        ev += [(s, e, lab) for s, e in db.execute(f"select start, end from {tab}")]
    except sqlite3.OperationalError:
        pass
ev.sort()
by = collections.defaultdict(list)
for s, e, k in ev:
    by[k].append((s, e))
# the most frequent long kernel defines a call
main = max(by, key=lambda k: (len(by[k]) >= n) * sum(e - s for s, e in by[k]))
starts = [s for s, e in by[main]][-n:]
t0 = starts[0]
tail = [x for x in ev if x[0] >= t0]
per = collections.defaultdict(list)
for s, e, k in tail:
    per[k].append(e - s)
calls = len(starts)
span = (tail[-1][1] - t0) / calls
tot = 0
for k, v in sorted(per.items(), key=lambda kv: -sum(kv[1])):
    c = len(v) / calls
    tot += sum(v) / calls
    print(f"{S.median(v)/1e3:9.1f} us x{c:4.1f}  {k}")
print(f"busy {tot/1e3:.1f} us per call, span {span/1e3:.1f} us per call ({calls} calls)")
