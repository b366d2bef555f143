// Argo Rollouts' own validators (npm @kubernetes-models/argo-rollouts, generated from its Go
// types): each JSON document on stdin's array validated; one result per document on stdout.
import { readFileSync } from "node:fs";
import { Rollout } from "@kubernetes-models/argo-rollouts/argoproj.io/v1alpha1/Rollout";
import { AnalysisTemplate } from "@kubernetes-models/argo-rollouts/argoproj.io/v1alpha1/AnalysisTemplate";

const kinds = { Rollout, AnalysisTemplate };
const out = [];
for (const d of JSON.parse(readFileSync(0, "utf8"))) {
  const Kind = kinds[d.kind];
  if (!Kind) { out.push(`no validator for kind ${d.kind}`); continue; }
  try { new Kind(d).validate(); out.push(null); } catch (e) { out.push(String(e.message || e)); }
}
console.log(JSON.stringify(out));
