import sqlite3, sys, collections
db = sqlite3.connect(sys.argv[1])
names = dict(db.execute("select id, value from StringIds"))
ev = []
for s, e, n in db.execute("select start, end, shortName from CUPTI_ACTIVITY_KIND_KERNEL"):
    ev.append((s, e, "K " + names[n][:70]))
for tab, lab in (("CUPTI_ACTIVITY_KIND_MEMCPY", "memcpy"), ("CUPTI_ACTIVITY_KIND_MEMSET", "memset")):
    try:
        for s, e, k in db.execute(f"select start, end, copyKind from {tab}" if lab == "memcpy" else f"select start, end, 0 from {tab}"):
            ev.append((s, e, f"{lab} kind {k}"))
    except sqlite3.OperationalError:
        pass
ev.sort()
last = ev[-120:]  # steady state
main = [x for x in last if "attention" in x[2] or "fprop" in x[2] or "flash" in x[2]]
print("events in the last 120:", collections.Counter(x[2] for x in last).most_common(8))
st = [x[0] for x in main]
dur = [x[1] - x[0] for x in main]
gaps = [b - a for a, b in zip([x[1] for x in main], st[1:])]
import statistics as S
print(f"main kernels {len(main)}: median duration {S.median(dur)/1e3:.1f} us, median start-to-start {S.median([b-a for a,b in zip(st,st[1:])])/1e3:.1f} us, median gap {S.median(gaps)/1e3:.2f} us")
