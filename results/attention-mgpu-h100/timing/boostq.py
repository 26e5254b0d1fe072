"""Main-kernel durations back to back vs after an idle gap. usage: boostq.py DB"""
import sqlite3, sys, statistics as S
db = sqlite3.connect(sys.argv[1])
names = dict(db.execute("select id, value from StringIds"))
ev = sorted((s, e, names[k]) for s, e, k in db.execute("select start, end, shortName from CUPTI_ACTIVITY_KIND_KERNEL"))
main = max(set(n for _, _, n in ev), key=lambda n: sum(e - s for s, e, k in ev if k == n))
ks = [(s, e) for s, e, n in ev if n == main]
idle = [e - s for (s0, e0), (s, e) in zip(ks, ks[1:]) if s - e0 > 20e6]
hot = [e - s for (s0, e0), (s, e) in zip(ks, ks[1:]) if s - e0 < 1e6]
print(f"{main[:60]}: back to back {S.median(hot[-40:])/1e3:.1f} us (n={len(hot[-40:])}), after 50 ms idle {S.median(idle)/1e3:.1f} us (n={len(idle)}) ratio {S.median(hot[-40:])/S.median(idle):.3f}")
