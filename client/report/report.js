// moeplan's HTML report (client/include/moeplan/client/html_report.h,
// docs/report.md): builds the page from the JSON in #moeplan-data, with
// Chart.js for the charts. Every string from the data is set as text
// (textContent, never innerHTML). When done, <body> carries data-ready="1" and
// data-charts (each chart's id and the points it drew), which the browser test
// compares with the data.
(function () {
  'use strict';
  const data = JSON.parse(document.getElementById('moeplan-data').textContent);
  const kind = document.body.dataset.kind;
  const app = document.getElementById('app');
  const drawn = {};
  const GiB = 1024 * 1024 * 1024;
  const PALETTE = ['#4e79a7', '#f28e2b', '#e15759', '#76b7b2', '#59a14f', '#edc948',
                   '#b07aa1', '#ff9da7', '#9c755f', '#bab0ac', '#86bcb6', '#d37295'];

  // --- DOM helpers: text only ---------------------------------------------
  function el(tag, props, children) {
    const e = document.createElement(tag);
    for (const [k, v] of Object.entries(props || {})) {
      if (k === 'text') e.textContent = v;
      else if (k === 'className') e.className = v;
      else if (k.startsWith('data-')) e.setAttribute(k, v);
      else e[k] = v;
    }
    for (const c of children || []) e.append(c);
    return e;
  }
  function section(title, note) {
    const s = el('section', {}, [el('h2', {text: title})]);
    if (note) s.append(el('p', {className: 'note', text: note}));
    app.append(s);
    return s;
  }
  // The largest of `floor` and f(x) over `xs` (a loop: spreading a search's
  // tens of thousands of points into Math.max would overflow the stack).
  function maxOf(floor, xs, f) {
    let m = floor;
    for (const x of xs) m = Math.max(m, Number(f(x) || 0));
    return m;
  }
  function num(x, digits) {
    const v = Number(x || 0);
    return v.toLocaleString('en-US', {minimumFractionDigits: digits, maximumFractionDigits: digits});
  }
  function kv(pairs) {
    const dl = el('dl', {className: 'kv'});
    for (const [k, v] of pairs) dl.append(el('dt', {text: k}), el('dd', {text: String(v)}));
    return dl;
  }
  // columns: [{name, get(row) -> value, digits?}]; rows: objects; attrs(row) -> data-* map.
  function table(columns, rows, attrs) {
    const head = el('tr', {}, columns.map(c => el('th', {text: c.name})));
    const body = el('tbody');
    for (const r of rows) {
      const tr = el('tr', attrs ? attrs(r) : {});
      for (const c of columns) {
        const v = c.get(r);
        const text = typeof v === 'number' ? num(v, c.digits === undefined ? 0 : c.digits) : String(v);
        tr.append(el('td', {text: text, className: typeof v === 'number' ? 'n' : ''}));
      }
      body.append(tr);
    }
    return el('div', {className: 'scroll'}, [el('table', {}, [el('thead', {}, [head]), body])]);
  }
  // A Chart.js chart; `points` is what the test checks against the data
  // (null: the bars Chart.js placed, every dataset's: those with a finite
  // position, start and end, so malformed data does not count).
  function chart(parent, id, config, points, height) {
    const canvas = el('canvas', {id: id});
    parent.append(el('div', {className: 'chart', style: `height:${height || 360}px`}, [canvas]));
    config.options = Object.assign({animation: false, responsive: true,
                                    maintainAspectRatio: false}, config.options || {});
    const c = new Chart(canvas, config);
    if (points === null) {
      const placed = e => [e.x, e.y, e.base].every(Number.isFinite);
      points = config.data.datasets.reduce(
          (n, d, i) => n + c.getDatasetMeta(i).data.filter(placed).length, 0);
    }
    canvas.dataset.points = String(points);
    drawn[id] = points;
  }
  function stacked(labels, series, unit, horizontal) {
    return {
      type: 'bar',
      data: {labels: labels,
             datasets: series.map((s, i) => ({label: s.label, data: s.data,
                                              backgroundColor: PALETTE[i % PALETTE.length]}))},
      options: {indexAxis: horizontal ? 'y' : 'x',
                scales: {x: {stacked: true, title: {display: horizontal, text: unit}},
                         y: {stacked: true, title: {display: !horizontal, text: unit}}}},
    };
  }

  // --- plan-model -------------------------------------------------------------
  function pipelineText(l) {
    let p = l.pipeline || '-';
    if (p === 'interleaved' && l.virtual_stages > 1) p += ' v=' + l.virtual_stages;
    if (l.recompute) p += ' +recompute';
    else if ((l.recompute_modules || []).length) p += ' +recompute:' + l.recompute_modules.join('+');
    if (l.sequence_parallel) p += ' +sp';
    if (l.a2a_overlap) p += ' +a2a';
    if (l.dispatcher && l.dispatcher !== 'alltoall') p += ' +' + l.dispatcher;
    return p;
  }
  function candidateRow(c) {
    return Object.assign({}, c, {l: c.layout || {}, m: c.memory || {}});
  }
  function planModel() {
    const plan = data.plan;
    const model = data.model;
    const acc = plan.accounting || {};
    const head = section('Plan');
    head.append(kv([
      ['model', model.name || '(unnamed)'],
      ['cluster profile', `${data.profile.name} v${data.profile.version} (${data.profile.nodes} nodes × ${data.profile.gpus_per_node} GPUs)`],
      ['GPUs', plan.gpus || plan.ranks],
      ['global batch', plan.global_batch_size || model.global_batch_size],
      ['parameters', `${num(acc.total_params / 1e9, 2)} B total, ${num(acc.active_params / 1e9, 2)} B active`],
      ['model FLOPs per token', `${num(acc.flops_per_token / 1e9, 1)} GFLOP`],
    ]));
    const stats = plan.search_stats;
    if (stats && Number(stats.enumerated) > 0) {
      section('Search').append(kv([
        ['candidates enumerated', stats.enumerated], ['pruned by memory', stats.pruned_memory],
        ['pruned by the bound', stats.pruned_bound], ['simulated', stats.simulated],
        ['stages planned', stats.stage_plans], ['stages reused', stats.stage_cache_hits],
        ['too many pipeline steps', stats.over_limit], ['over the plan memory bound', stats.over_memory],
        ['search time', `${num(stats.elapsed_ms, 1)} ms`],
      ]));
    }
    const cands = (plan.candidates || []).map(candidateRow);
    if (cands.length) candidates(cands);
    else variants(plan);
  }
  function candidates(cands) {
    const s = section('Candidates', 'Ranked by iteration time; filter by family and feasibility.');
    const families = [...new Set(cands.map(c => c.family || c.l.family || '-'))];
    const famSel = el('select', {id: 'filter-family'},
                      [el('option', {value: '', text: 'every family'})].concat(
                          families.map(f => el('option', {value: f, text: f}))));
    const feasSel = el('select', {id: 'filter-feasible'}, [
      el('option', {value: '', text: 'feasible and not'}), el('option', {value: 'yes', text: 'feasible'}),
      el('option', {value: 'no', text: 'infeasible'})]);
    s.append(el('div', {className: 'filters'}, [el('label', {text: 'family '}), famSel,
                                                 el('label', {text: ' feasibility '}), feasSel]));
    const tab = table([
      {name: 'rank', get: c => c.rank}, {name: 'family', get: c => c.family || c.l.family || '-'},
      {name: 'dp', get: c => c.l.dp}, {name: 'tp', get: c => c.l.tp}, {name: 'pp', get: c => c.l.pp},
      {name: 'ep', get: c => c.l.ep}, {name: 'etp', get: c => c.l.esp}, {name: 'cp', get: c => c.l.cp || 1},
      {name: 'm', get: c => c.l.microbatches}, {name: 'zero', get: c => c.l.zero_stage},
      {name: 'pipeline', get: c => pipelineText(c.l)},
      {name: 'iteration ms', get: c => c.iteration_us / 1000, digits: 1},
      {name: 'tokens/s/GPU', get: c => c.tokens_per_s_per_gpu},
      {name: 'TFLOP/s', get: c => c.tflops_per_gpu, digits: 1},
      {name: 'MFU %', get: c => 100 * c.mfu, digits: 1},
      {name: 'GiB/GPU', get: c => c.memory_bytes_per_gpu / GiB, digits: 1},
      {name: 'bubble %', get: c => 100 * c.bubble_fraction, digits: 1},
      {name: 'variant', get: c => c.variant || '-'},
      {name: 'feasible', get: c => c.feasible ? 'yes' : 'no: ' + (c.infeasible_reason || '')},
    ], cands, c => ({'data-family': c.family || c.l.family || '-', 'data-feasible': c.feasible ? 'yes' : 'no'}));
    tab.id = 'candidates';
    s.append(tab);
    const apply = () => {
      for (const tr of tab.querySelectorAll('tbody tr')) {
        const ok = (!famSel.value || tr.dataset.family === famSel.value) &&
                   (!feasSel.value || tr.dataset.feasible === feasSel.value);
        tr.hidden = !ok;
      }
    };
    famSel.addEventListener('change', apply);
    feasSel.addEventListener('change', apply);

    // Throughput against memory, with the device's memory: the ranked
    // candidates and, where the search returned them, every candidate it
    // enumerated (simulated; bounded: no faster than plotted; over memory:
    // not timed, on the axis).
    const limit = maxOf(0, cands, c => c.m.limit_bytes) / GiB;
    const xy = c => ({x: Number(c.memory_bytes_per_gpu || 0) / GiB, y: Number(c.tokens_per_s_per_gpu || 0)});
    const pts = f => cands.filter(c => !!c.feasible === f).map(xy);
    const all = (data.plan.search_points || []).filter(p => p.kind !== 'skipped');
    const ymax = maxOf(maxOf(1, cands, c => c.tokens_per_s_per_gpu), all,
                       p => p.tokens_per_s_per_gpu) * 1.05;
    const sets = [{label: 'ranked, feasible', data: pts(true), backgroundColor: PALETTE[0], pointRadius: 4},
                  {label: 'ranked, infeasible', data: pts(false), backgroundColor: PALETTE[2], pointRadius: 4}];
    const pointKinds = [['simulated', 'simulated', PALETTE[3]],
                        ['bound', 'pruned by its bound (no faster)', PALETTE[9]],
                        ['over_memory', 'over memory (not timed)', PALETTE[1]]];
    for (const [kind, label, color] of pointKinds) {
      const ps = all.filter(p => p.kind === kind).map(xy);
      if (ps.length) sets.push({label: label, data: ps, backgroundColor: color, pointRadius: 2});
    }
    if (limit > 0) {
      sets.push({label: `device memory (${num(limit, 1)} GiB)`, type: 'line', data: [{x: limit, y: 0}, {x: limit, y: ymax}],
                 borderColor: '#333', borderDash: [6, 4], pointRadius: 0, showLine: true});
    }
    const sc = section('Throughput against memory per GPU', all.length ?
        `The ${cands.length} ranked candidates over all ${all.length} the search enumerated and could cost.` : '');
    chart(sc, 'chart-throughput-memory', {type: 'scatter', data: {datasets: sets},
      options: {scales: {x: {title: {display: true, text: 'GiB per GPU'}, min: 0},
                         y: {title: {display: true, text: 'tokens/s per GPU'}, min: 0}}}},
      cands.length + all.length, 420);

    const top = cands.slice(0, 10);
    const labels = top.map(c => '#' + c.rank + ' ' + (c.family || c.l.family || ''));
    const kinds = [...new Set(top.flatMap(c => (c.exposed_comm || []).map(t => t.term)))];
    const ms = x => Number(x || 0) / 1000;
    const series = [{label: 'compute', data: top.map(c => ms(c.compute_us - (c.recompute_us || 0)))},
                    {label: 'recomputation', data: top.map(c => ms(c.recompute_us))}];
    for (const k of kinds) {
      series.push({label: 'exposed ' + k,
                   data: top.map(c => ms(((c.exposed_comm || []).find(t => t.term === k) || {}).us))});
    }
    series.push({label: 'gradient sync', data: top.map(c => ms(c.grad_sync_us))},
                {label: 'optimizer', data: top.map(c => ms(c.optimizer_us))},
                {label: 'bubble', data: top.map(c => ms(c.bubble_us))});
    chart(section('Where the time goes', 'The busiest stage, per iteration (top 10).'),
          'chart-time', stacked(labels, series, 'ms', true), top.length, 60 + 36 * top.length);
    const mem = [['weights', 'params_bytes'], ['gradients', 'grads_bytes'], ['optimizer', 'optimizer_bytes'],
                 ['activations', 'activations_bytes'], ['buffers', 'capacity_buffer_bytes']]
                    .map(([label, key]) => ({label: label, data: top.map(c => Number(c.m[key] || 0) / GiB)}));
    chart(section('Memory per GPU', 'The stage that needs the most (top 10).'),
          'chart-memory', stacked(labels, mem, 'GiB', true), top.length, 60 + 36 * top.length);

    pipelines(top);

    const launch = section('Launch', 'Megatron-LM arguments and the DeepSpeed config keys of each layout, to copy.');
    top.forEach((c, i) => {
      const block = (label, text) => {
        const pre = el('pre', {text: text});
        const copy = el('button', {text: 'copy', type: 'button'});
        copy.addEventListener('click', () => navigator.clipboard && navigator.clipboard.writeText(text));
        return el('div', {className: 'launch'}, [el('h4', {text: label}), copy, pre]);
      };
      launch.append(el('details', {open: i === 0}, [
        el('summary', {text: `#${c.rank} ${c.family || ''} dp ${c.l.dp} tp ${c.l.tp} pp ${c.l.pp} ep ${c.l.ep}`}),
        block('Megatron-LM', (c.megatron_args || []).join(' ')),
        block('DeepSpeed', c.deepspeed_config || '')]));
    });
  }
  // Each candidate's pipeline of one iteration: per stage its steps, the
  // overlapped pairs, its tail, and (thin) the sends on its link.
  const SPAN_KINDS = [['forward', 'forward', PALETTE[0], 0.8], ['backward', 'backward', PALETTE[4], 0.8],
                      ['forward_backward', 'forward + backward overlapped', PALETTE[6], 0.8],
                      ['tail', 'gradient sync + optimizer', PALETTE[9], 0.8],
                      ['send_forward', 'send activation', PALETTE[1], 0.25],
                      ['send_backward', 'send gradient', PALETTE[2], 0.25]];
  function spanText(p, chunks) {
    const step = (dir, c, mb) => `${dir} mb ${mb || 0}` + (chunks > 1 ? ` chunk ${c || 0}` : '');
    const what = {forward: () => step('F', p.chunk, p.microbatch),
                  backward: () => step('B', p.chunk, p.microbatch),
                  forward_backward: () => step('F', p.chunk, p.microbatch) + ' + ' +
                                          step('B', p.backward_chunk, p.backward_microbatch),
                  send_forward: () => 'send ' + step('F', p.chunk, p.microbatch),
                  send_backward: () => 'send ' + step('B', p.chunk, p.microbatch),
                  tail: () => 'gradient sync + optimizer'}[p.kind];
    return `${what ? what() : p.kind}: ${num(p.start_us / 1000, 2)}–${num(p.end_us / 1000, 2)} ms`;
  }
  function pipelines(top) {
    const shown = top.filter(c => (c.pipeline || []).length);
    if (!shown.length) return;
    const s = section('Pipeline of one iteration',
        `Every stage's steps as simulated (top ${shown.length}); thin bars are the sends on the stage's link. ` +
        'Hover a bar for its micro-batch.');
    const ms = x => Number(x || 0) / 1000;
    for (const c of shown) {
      const pp = Math.max(1, Number(c.l.pp || 1));
      const chunks = maxOf(0, c.pipeline, p => p.chunk) + 1;
      const sets = [];
      for (const [kind, label, color, width] of SPAN_KINDS) {
        const spans = c.pipeline.filter(p => p.kind === kind);
        if (!spans.length) continue;
        sets.push({label: label, backgroundColor: color, barPercentage: width, categoryPercentage: 1,
                   grouped: false,
                   data: spans.map(p => ({x: [ms(p.start_us), ms(p.end_us)], y: 'stage ' + (p.stage || 0), span: p}))});
      }
      const head = `#${c.rank} ${c.family || c.l.family || ''} dp ${c.l.dp} tp ${c.l.tp} pp ${c.l.pp} ` +
                   `ep ${c.l.ep}, ${pipelineText(c.l)}, m ${c.l.microbatches}: ` +
                   `${num(c.iteration_us / 1000, 1)} ms, bubble ${num(100 * c.bubble_fraction, 1)} %`;
      const box = el('div', {className: 'pipeline'}, [el('h4', {text: head})]);
      s.append(box);
      chart(box, 'chart-pipeline-' + c.rank, {type: 'bar',
        data: {labels: Array.from({length: pp}, (_, i) => 'stage ' + i), datasets: sets},
        options: {indexAxis: 'y',
                  scales: {x: {min: 0, title: {display: true, text: 'ms'}}},
                  plugins: {tooltip: {callbacks: {label: ctx => spanText(ctx.raw.span, chunks)}}}}},
        null, 80 + 28 * pp);
    }
  }
  function variants(plan) {
    const vs = plan.variants || [];
    const s = section('Overlap variants', 'Best: ' + (plan.best_variant || '-'));
    s.append(table([
      {name: 'variant', get: v => v.name}, {name: 'iteration ms', get: v => v.iteration_us / 1000, digits: 2},
      {name: 'forward ms', get: v => v.forward_us / 1000, digits: 2},
      {name: 'backward ms', get: v => v.backward_us / 1000, digits: 2},
      {name: 'exposed comm ms', get: v => v.exposed_comm_us / 1000, digits: 2},
      {name: 'hidden comm ms', get: v => v.hidden_comm_us / 1000, digits: 2},
      {name: 'tokens/s/GPU', get: v => v.tokens_per_s_per_gpu},
    ], vs));
    chart(s, 'chart-variants', stacked(vs.map(v => v.name), [
      {label: 'compute', data: vs.map(v => v.compute_us / 1000)},
      {label: 'exposed communication', data: vs.map(v => v.exposed_comm_us / 1000)}], 'ms', true),
      vs.length, 60 + 36 * vs.length);
  }

  // --- plan-layer -------------------------------------------------------------
  function planLayer() {
    const plan = data.plan;
    const d = plan.decision || {};
    section('Plan').append(kv([
      ['layer', (data.layer || {}).name || '(unnamed)'],
      ['cluster profile', `${data.profile.name} v${data.profile.version}`],
      ['best schedule', plan.best_schedule], ['why', d.summary || '-'],
    ]));
    const cs = plan.candidates || [];
    const s = section('Schedules');
    s.append(table([
      {name: 'schedule', get: c => c.schedule}, {name: 'forward µs', get: c => c.forward_us, digits: 1},
      {name: 'backward µs', get: c => c.backward_us, digits: 1}, {name: 'total µs', get: c => c.total_us, digits: 1},
      {name: 'compute µs', get: c => c.compute_us, digits: 1},
      {name: 'exposed comm µs', get: c => c.exposed_comm_us, digits: 1},
      {name: 'hidden comm µs', get: c => c.hidden_comm_us, digits: 1},
      {name: 'inter-node MiB', get: c => Number(c.inter_node_bytes) / (1 << 20), digits: 2},
    ], cs));
    const terms = [...new Set(cs.flatMap(c => (c.critical_terms || []).map(t => t.term)))];
    chart(section('Critical path by term'), 'chart-terms', stacked(cs.map(c => c.schedule), terms.map(t => ({
      label: t, data: cs.map(c => Number(((c.critical_terms || []).find(x => x.term === t) || {}).us || 0))})),
      'µs', true), cs.length, 60 + 40 * cs.length);
    const best = cs[0];
    if (best && (best.ops || []).length) {
      const resources = [...new Set(best.ops.map(o => o.resource))];
      const sets = ['compute', 'comm'].map((k, i) => ({
        label: k, backgroundColor: PALETTE[i],
        data: best.ops.filter(o => (o.kind || 'compute') === k).map(o => ({x: [o.start_us, o.end_us], y: o.resource, name: o.name}))}));
      chart(section('Timeline of ' + best.schedule, 'Each op on its resource, forward then backward.'),
            'chart-timeline', {type: 'bar', data: {labels: resources, datasets: sets},
              options: {indexAxis: 'y', scales: {x: {title: {display: true, text: 'µs'}}, y: {stacked: true}},
                        plugins: {tooltip: {callbacks: {label: c => c.raw.name}}}}},
            best.ops.length, 80 + 40 * resources.length);
    }
  }

  // --- validate ---------------------------------------------------------------
  function validate() {
    const s = data.summary;
    section('Validation').append(kv([
      ['profile', s.profile], ['ranks', `${s.ranks} on ${s.hosts} host(s)`],
      ['configs', s.configs], ['points', s.points],
      ['MAPE', `${num(s.mape_pct, 1)} % (p90 ${num(s.p90_pct, 1)} %, max ${num(s.max_pct, 1)} %)`],
      ['mean signed error', `${num(s.mean_signed_pct, 1)} %`],
      ['selection accuracy', `${num(s.selection_accuracy_pct, 1)} % (with ties ${num(s.selection_accuracy_tied_pct, 1)} %)`],
      ['composition MAPE', `${num(s.composition_mape_pct, 1)} %`], ['cost MAPE', `${num(s.cost_mape_pct, 1)} %`],
    ]));
    const points = (s.results || []).flatMap(c => (c.points || []).map(p => Object.assign({config: c.name}, p)));
    const max = maxOf(maxOf(1, points, p => p.measured_us), points, p => p.predicted_us) * 1.05;
    chart(section('Predicted against measured', 'One point per config and candidate; the line is exact.'),
          'chart-predicted-measured', {type: 'scatter', data: {datasets: [
            {label: 'points', data: points.map(p => ({x: p.measured_us / 1000, y: p.predicted_us / 1000})),
             backgroundColor: PALETTE[0]},
            {label: 'predicted = measured', type: 'line', data: [{x: 0, y: 0}, {x: max / 1000, y: max / 1000}],
             borderColor: '#333', borderDash: [6, 4], pointRadius: 0, showLine: true}]},
            options: {scales: {x: {title: {display: true, text: 'measured ms'}, min: 0},
                               y: {title: {display: true, text: 'predicted ms'}, min: 0}}}}, points.length);
    section('Per config').append(table([
      {name: 'config', get: p => p.config}, {name: 'candidate', get: p => p.candidate || '-'},
      {name: 'measured ms', get: p => p.measured_us / 1000, digits: 3},
      {name: 'predicted ms', get: p => p.predicted_us / 1000, digits: 3},
      {name: 'error %', get: p => p.error_pct, digits: 1},
    ], points));
    const ops = s.ops || [];
    const os = section('Per op kind', 'Largest share of the measured time first.');
    os.append(table([
      {name: 'op', get: o => o.op}, {name: 'count', get: o => o.count},
      {name: 'MAPE %', get: o => o.mape_pct, digits: 1}, {name: 'p90 %', get: o => o.p90_pct, digits: 1},
      {name: 'mean signed %', get: o => o.mean_signed_pct, digits: 1},
      {name: 'share of measured %', get: o => o.measured_share_pct, digits: 1},
    ], ops));
    if (ops.length) {
      chart(os, 'chart-ops', {type: 'bar', data: {labels: ops.map(o => o.op), datasets: [
        {label: 'mean signed error %', data: ops.map(o => o.mean_signed_pct), backgroundColor: PALETTE[1]}]},
        options: {indexAxis: 'y'}}, ops.length, 60 + 22 * ops.length);
    }
  }

  try {
    if (kind === 'plan-model') planModel();
    else if (kind === 'plan-layer') planLayer();
    else if (kind === 'validate') validate();
    else throw new Error('unknown report kind: ' + kind);
    document.body.dataset.charts = JSON.stringify(drawn);
    document.body.dataset.ready = '1';
  } catch (e) {
    app.append(el('p', {className: 'error', text: 'The report could not be drawn: ' + e}));
    console.error(e);
    throw e;
  }
})();
