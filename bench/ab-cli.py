#!/usr/bin/env python3
"""Same-run comparison of whole `run -- true` processes (scenario 6) between builds.

    bench/ab-cli.py OLD_BINARY NEW_BINARY [...] ROUNDS

Each round runs every binary's `smithers-sandbox run -- true` (each in a project of its
own under /var/tmp, its sandboxes removed after, untimed) and bare bwrap with the same
isolation as `smithers-bench whole-cli`, interleaved, after 5 warm-up rounds. Prints each
binary's p50 and the median of its per-round ratios to bwrap: on a machine whose load moves
(bwrap's own p50 went from 5.4 to 10 ms over a day here), only such a same-run comparison
says what a change gave. Needs `bwrap` on PATH (`apt-get install bubblewrap`; scripts/setup
does not install it, the product does not use it).
"""
import subprocess, time, statistics, sys, os, shutil
bins=sys.argv[1:-1]; N=int(sys.argv[-1])
BW=['bwrap','--unshare-all','--die-with-parent','--ro-bind','/','/','--dev','/dev','--proc','/proc','--tmpfs','/tmp','true']
projs=[]
for i,b in enumerate(bins):
    p='/var/tmp/ab%d'%i; os.makedirs(p,exist_ok=True); open(p+'/README','w').write('x\n'); projs.append(p)
def run(cmd,cwd):
    t0=time.perf_counter(); r=subprocess.run(cmd,cwd=cwd,stdin=subprocess.DEVNULL,stdout=subprocess.DEVNULL,stderr=subprocess.DEVNULL); t=time.perf_counter()-t0
    assert r.returncode==0, (cmd, r.returncode); return t*1000
res={b:[] for b in bins}; bw=[]
for i in range(N+5):
    row={}
    for b,p in zip(bins,projs):
        row[b]=run([b,'run','--','true'],p); shutil.rmtree(p+'/.smithers/sandboxes',ignore_errors=True)
    w=run(BW,'/tmp')
    if i<5: continue
    bw.append(w)
    for b in bins: res[b].append(row[b]/w)
    for b in bins: res.setdefault(b+'#ms',[]).append(row[b])
print("bwrap p50 %.2f ms"%statistics.median(bw))
for b in bins: print("%-40s p50 %.2f ms  ratio %.2fx"%(b, statistics.median(res[b+'#ms']), statistics.median(res[b])))
