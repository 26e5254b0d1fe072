"""Timeline around the last calls of kernel NAME in an nsys sqlite. usage: kern2.py DB NAME N"""
import sqlite3, sys, statistics as S
db = sqlite3.connect(sys.argv[1]); name, n = sys.argv[2], int(sys.argv[3])
names = dict(db.execute("select id, value from StringIds"))
ev = [(s, e, names[k][:70]) for s, e, k in db.execute("select start, end, shortName from CUPTI_ACTIVITY_KIND_KERNEL")]
for tab, lab in (("CUPTI_ACTIVITY_KIND_MEMCPY", "memcpy"), ("CUPTI_ACTIVITY_KIND_MEMSET", "memset")):
    try:
        ev += [(s, e, lab + str(k)) for s, e, k in db.execute(f"select start, end, copyKind from {tab}")] if lab == "memcpy" else [(s, e, lab) for s, e in db.execute(f"select start, end from {tab}")]
    except sqlite3.OperationalError:
        pass
ev.sort()
main = [x for x in ev if name in x[2]][-n:]
iv = [b[0] - a[0] for a, b in zip(main, main[1:])]
print(f"{name}: median {S.median([e - s for s, e, _ in main])/1e3:.1f} us, start-to-start median {S.median(iv)/1e3:.1f} us [{min(iv)/1e3:.1f}, {max(iv)/1e3:.1f}]")
a, b = main[-3][0], main[-2][0]
prev = None
for s, e, k in ev:
    if a <= s <= b:
        gap = (s - prev) / 1e3 if prev else 0
        print(f"  +{gap:8.1f} us gap  {(e - s)/1e3:9.1f} us  {k}")
        prev = e
